// libFuzzer target over the request layer (RequestHandler) with the real
// memory budget, pools, allocator, sessions, signal boards and copy engine
// behind it, as hostkvd runs them minus gRPC.
//
// Each input is decoded (FuzzedDataProvider) into at most kMaxOps requests:
// Alloc, Free, HandOverPages, Load, Backup, ReadPages, WritePages,
// GetPageBufferMeta, RegisterDeviceBuffers, UnregisterDeviceBuffers,
// CreatePool, DeletePool, OpenSession, RenewSession, CloseSession (or
// EndSession, as the session monitor does), AttachSession, an idle-session
// sweep (ExpireIdleSessions), GetPoolStats, GetPool, ListPools, and a
// Backup-then-Load round trip. Fields are biased towards what breaks code:
// 0, 1, sizes next to the pool's, UINT64_MAX, offset/size pairs that
// overflow, ids of open sessions and imports most of the time and stale or
// random ones otherwise.
//
// Besides "no crash, no sanitizer report", the harness keeps a model of what
// each session owns and checks after every request:
//   - per pool: free_pages + sum(UsageByOwner) == num_pages, every owner is
//     an open session, and each session owns exactly the pages the model
//     says;
//   - answers agree with the model: Alloc returns pages that were free,
//     Free/HandOverPages/CloseSession report what was listed or owned, a
//     request the contract says must succeed does (only when no copy is in
//     flight), GetPoolStats matches the model;
//   - shm buffers are accepted only from sessions attached by a peer whose
//     uid owns the segment (or root), and only inside the segment;
//   - WritePages then ReadPages gives the same bytes back; Backup then Load
//     gives the device rows back; GetPageBufferMeta pieces lie inside the
//     pool and add up to the pages' bytes; after the copies are done every
//     owned page is readable (no pin left behind).
// A violated check prints what and aborts, which libFuzzer saves as a crash.
//
// Every input starts from the same state (two base pools, two attached
// sessions owning a few pages, three device-buffer registrations) and ends
// by closing every session and deleting the pools it created, so a saved
// crash reproduces on its own.
// Copies run on the engine's threads; after a transfer the harness normally
// waits for the session's signal board to go idle, and now and then lets up
// to kMaxOutstanding copies run on while the next requests come in.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "hostkv/v1/hostkv.pb.h"
#include "proto/contract/shm_segment.h"
#include "server/memory_budget.h"
#include "server/pool_registry.h"
#include "server/request_handler.h"
#include "server/session_registry.h"
#include "server/transfer_engine.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

constexpr int kMaxOps = 64;
constexpr uint32_t kSignalRecords = 4;
constexpr size_t kMaxSessions = 8;
constexpr int kMaxOutstanding = 2;
constexpr uint64_t kBudgetBytes = 8ull << 20;
constexpr uint64_t kMaxPageIoBytes = 16ull << 10;
constexpr uint64_t kDeviceBytes = 256ull << 10;
constexpr uint64_t kSmallDeviceBytes = 4096;
constexpr uint64_t kMaxDeviceSlots = 64;
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

const char* const kBasePools[] = {"p0", "p1"};
const char* const kFuzzPools[] = {"f0", "f1", "f2"};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "request_fuzzer: invariant violated: %s\n",
               what.c_str());
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_CHECK(cond, ...)                                      \
  do {                                                             \
    if (!(cond)) {                                                 \
      Die(absl::StrCat(__FILE__, ":", __LINE__, ": ", #cond, ": ", \
                       ##__VA_ARGS__));                            \
    }                                                              \
  } while (0)

RequestLimits MakeLimits(const std::string& prefix) {
  RequestLimits limits;
  limits.max_page_io_bytes = kMaxPageIoBytes;
  limits.reserved_segment_prefix = prefix;
  // As deployed: shm buffers only for sessions attached by a peer whose uid
  // owns the segments (AttachSession stands in for the session socket).
  limits.allow_unverified_shm_names = false;
  return limits;
}

v1::PoolSpec BaseSpec(int which) {
  v1::PoolSpec spec;
  spec.set_name(kBasePools[which]);
  if (which == 0) {  // MHA page_first, 2 layers x 2 heads x 4, bf16, 101 pages
    spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
    auto* mha = spec.mutable_geometry()->mutable_mha();
    mha->set_num_layers(2);
    mha->set_num_kv_heads(2);
    mha->set_head_dim(4);
    spec.set_page_size(4);
    spec.set_layout(v1::LAYOUT_PAGE_FIRST);
    spec.set_capacity_tokens(400);
  } else {  // MLA layer_first, 3 layers x (4 + 2), fp16, 151 pages
    spec.mutable_geometry()->set_dtype(v1::DTYPE_FP16);
    auto* mla = spec.mutable_geometry()->mutable_mla();
    mla->set_num_layers(3);
    mla->set_kv_lora_rank(4);
    mla->set_qk_rope_head_dim(2);
    spec.set_page_size(2);
    spec.set_layout(v1::LAYOUT_LAYER_FIRST);
    spec.set_capacity_tokens(300);
    spec.set_default_mechanism(v1::MECHANISM_KERNEL);
  }
  return spec;
}

// A registration as the harness built it: where each plane of each layer
// starts in the big device segment (empty if the request was mangled).
struct ImportModel {
  uint64_t id = 0;
  std::string pool;
  uint64_t token_slots = 0;
  std::vector<uint64_t> offsets[2];  // [kv][layer], in device_
};

struct SessionModel {
  uint64_t id = 0;
  OwnerTag tag = kNoOwner;
  bool attached = false;
  uint32_t uid = 0;                                 // of the attached peer
  std::map<std::string, std::set<uint64_t>> pages;  // pool -> owned pages
  std::vector<ImportModel> imports;
  uint64_t TotalPages() const {
    uint64_t n = 0;
    for (const auto& [pool, set] : pages) n += set.size();
    return n;
  }
};

std::vector<PageRun> ToRuns(
    const google::protobuf::RepeatedPtrField<v1::PageRun>& in) {
  std::vector<PageRun> out;
  for (const v1::PageRun& r : in)
    out.push_back({r.first_page(), r.num_pages()});
  return out;
}

class Harness {
 public:
  Harness()
      : prefix_(absl::StrCat("/hostkv-fuzz.", getpid(), ".")),
        budget_(kBudgetBytes, 0, [] { return uint64_t{1} << 40; }),
        pools_(&budget_, prefix_, 1),
        sessions_(prefix_, kSignalRecords),
        transfers_(2, /*metrics=*/nullptr),
        handler_(MakeLimits(prefix_), &budget_, &pools_, &sessions_,
                 &transfers_) {
    const std::string dev = absl::StrCat("/hostkv-fuzzdev.", getpid(), ".");
    auto big = ShmSegment::Create(dev + "big", kDeviceBytes, 0600);
    auto small = ShmSegment::Create(dev + "small", kSmallDeviceBytes, 0600);
    if (!big.ok() || !small.ok()) {
      Die(absl::StrCat(
          "cannot create device segments: ", big.status().ToString(), " / ",
          small.status().ToString()));
    }
    device_ = std::move(*big);
    small_device_ = std::move(*small);
  }

  ~Harness() {
    Quiesce();
    if (std::getenv("HOSTKV_FUZZ_STATS") != nullptr) PrintStats();
  }

  void RunOne(const uint8_t* data, size_t size) {
    SetUp();
    FuzzedDataProvider fdp(data, size);
    fdp_ = &fdp;
    for (int i = 0; i < kMaxOps && fdp.remaining_bytes() > 0; ++i) {
      Step();
      CheckInvariants();
    }
    Quiesce();
    CheckInvariants();
    CheckOwnedPagesReadable();
    fdp_ = nullptr;
    // Ending the sessions is part of this input: a failure there is saved
    // with the input that caused it.
    TearDown();
  }

 private:
  enum Op : uint8_t {
    kAlloc,
    kFree,
    kLoad,
    kBackup,
    kReadPages,
    kWritePages,
    kGetPageBufferMeta,
    kRegister,
    kUnregister,
    kCreatePool,
    kDeletePool,
    kOpenSession,
    kCloseSession,
    kGetPoolStats,
    kGetPool,
    kListPools,
    kRoundTrip,
    kHandOver,
    kRenewSession,
    kAttachSession,
    kExpireIdle,
    kOpCount
  };

  void Step() {
    const int op = fdp_->ConsumeIntegral<uint8_t>() % kOpCount;
    last_ok_ = false;
    Dispatch(op);
    ++calls_[op][last_ok_ ? 1 : 0];
  }

  void Note(bool ok) { last_ok_ = ok; }

  void Dispatch(int op) {
    switch (op) {
      case kAlloc:
        return DoAlloc();
      case kFree:
        return DoFree();
      case kLoad:
        return DoTransfer(/*load=*/true);
      case kBackup:
        return DoTransfer(/*load=*/false);
      case kReadPages:
        return DoReadPages();
      case kWritePages:
        return DoWritePages();
      case kGetPageBufferMeta:
        return DoGetPageBufferMeta();
      case kRegister:
        return DoRegister();
      case kUnregister:
        return DoUnregister();
      case kCreatePool:
        return DoCreatePool();
      case kDeletePool:
        return DoDeletePool();
      case kOpenSession:
        return DoOpenSession();
      case kCloseSession:
        return DoCloseSession();
      case kGetPoolStats:
        return DoGetPoolStats();
      case kGetPool: {
        v1::GetPoolRequest r;
        r.set_name(PickPoolName());
        Note(handler_.GetPool(r).ok());
        return;
      }
      case kListPools: {
        auto r = handler_.ListPools(v1::ListPoolsRequest());
        Note(r.ok());
        FUZZ_CHECK(r.ok() &&
                   r->pools_size() == static_cast<int>(pools_.List().size()));
        return;
      }
      case kRoundTrip:
        return DoRoundTrip();
      case kHandOver:
        return DoHandOver();
      case kRenewSession: {
        v1::RenewSessionRequest r;
        r.set_session_id(PickSessionId());
        auto s = handler_.RenewSession(r);
        Note(s.ok());
        FUZZ_CHECK(s.ok() == (FindLive(r.session_id()) != nullptr),
                   "RenewSession: ", s.status().ToString());
        return;
      }
      case kAttachSession:
        return DoAttachSession();
      case kExpireIdle:
        return DoExpireIdle();
      default:
        return;
    }
  }

  // With HOSTKV_FUZZ_STATS set: how often each request ran and succeeded
  // (to see whether inputs reach the interesting paths).
  void PrintStats() const {
    static const char* const kNames[] = {"Alloc",
                                         "Free",
                                         "Load",
                                         "Backup",
                                         "ReadPages",
                                         "WritePages",
                                         "GetPageBufferMeta",
                                         "RegisterDeviceBuffers",
                                         "UnregisterDeviceBuffers",
                                         "CreatePool",
                                         "DeletePool",
                                         "OpenSession",
                                         "CloseSession",
                                         "GetPoolStats",
                                         "GetPool",
                                         "ListPools",
                                         "RoundTrip",
                                         "HandOverPages",
                                         "RenewSession",
                                         "AttachSession",
                                         "ExpireIdleSessions"};
    static_assert(sizeof(kNames) / sizeof(kNames[0]) == kOpCount);
    std::fprintf(stderr, "%-24s %10s %10s\n", "request", "calls", "ok");
    for (int op = 0; op < kOpCount; ++op) {
      std::fprintf(stderr, "%-24s %10" PRIu64 " %10" PRIu64 "\n", kNames[op],
                   calls_[op][0] + calls_[op][1], calls_[op][1]);
    }
  }

  // ---- state ------------------------------------------------------------

  // Waits for every copy to finish and the engine to drop its operations
  // (which hold imports and pools).
  void Quiesce() {
    for (const SessionModel& s : live_) {
      if (auto session = sessions_.Get(s.id); session.ok()) {
        (*session)->signals()->AwaitIdle();
      }
    }
    while (transfers_.queued() != 0) std::this_thread::yield();
    outstanding_ = 0;
  }

  // Closes every session and deletes the pools the input created.
  void TearDown() {
    Quiesce();
    while (!live_.empty()) CloseLive(live_.size() - 1, /*expect_ok=*/true);
    closed_ids_.clear();
    CheckInvariants();
    for (const auto& pool : pools_.List()) {
      if (IsBasePool(pool->name())) continue;
      v1::DeletePoolRequest r;
      r.set_name(pool->name());
      auto s = handler_.DeletePool(r);
      Note(s.ok());
      FUZZ_CHECK(s.ok(), "teardown: delete pool ", pool->name(), ": ",
                 s.status().ToString());
    }
  }

  // The state every input starts from.
  void SetUp() {
    FUZZ_CHECK(live_.empty() && sessions_.List().empty());
    for (int i = 0; i < 2; ++i) {
      if (pools_.Get(kBasePools[i]).ok()) continue;
      v1::CreatePoolRequest r;
      *r.mutable_spec() = BaseSpec(i);
      auto s = handler_.CreatePool(r);
      Note(s.ok());
      FUZZ_CHECK(s.ok(), "setup: create base pool: ", s.status().ToString());
    }
    for (int i = 0; i < 2; ++i) {
      v1::OpenSessionRequest r;
      r.set_client_name(i == 0 ? "alice" : "bob");
      auto s = handler_.OpenSession(r);
      Note(s.ok());
      FUZZ_CHECK(s.ok(), "setup: open session: ", s.status().ToString());
      AddLive(s->session_id());
      FUZZ_CHECK(Attach(live_.back().id, geteuid()).ok());
    }
    // Alice has buffers for both base pools, Bob for p0; both own a few
    // pages, so that short inputs reach the transfer and page paths.
    FUZZ_CHECK(RegisterValid(0, "p0", 16, 0).ok());
    FUZZ_CHECK(RegisterValid(0, "p1", 32, 8192).ok());
    FUZZ_CHECK(RegisterValid(1, "p0", kMaxDeviceSlots, 65536).ok());
    AllocFor(0, "p0", 6);
    AllocFor(0, "p1", 8);
    AllocFor(1, "p0", 4);
  }

  // Attaches session `id` as a peer of this process with `uid` (what the
  // session socket does with SO_PEERCRED) and notes it in the model.
  absl::Status Attach(uint64_t id, uint32_t uid) {
    const absl::Status s = handler_.AttachSession(
        id, PeerCredentials{static_cast<uint32_t>(getpid()), uid,
                            static_cast<uint32_t>(getegid())});
    SessionModel* m = FindLive(id);
    if (s.ok()) {
      FUZZ_CHECK(m != nullptr && !m->attached, "attached session ", id,
                 " twice or unknown");
      m->attached = true;
      m->uid = uid;
    } else {
      FUZZ_CHECK(m == nullptr || m->attached, "attach refused: ", s.ToString());
    }
    return s;
  }

  // Whether a well-formed registration of device_ by `m` must succeed: the
  // session is attached by a peer whose uid owns the segment (or is root).
  bool MayRegister(const SessionModel* m) const {
    return m != nullptr && m->attached && (m->uid == 0 || m->uid == geteuid());
  }

  // Drops from the model the sessions that are no longer open (ended by
  // ExpireIdleSessions), after checking they were allowed to end.
  void Reconcile() {
    std::set<uint64_t> open;
    for (const auto& session : sessions_.List()) open.insert(session->id());
    for (size_t i = 0; i < live_.size();) {
      if (open.count(live_[i].id)) {
        ++i;
        continue;
      }
      FUZZ_CHECK(!live_[i].attached, "attached session ", live_[i].id,
                 " ended by the idle sweep");
      closed_ids_.push_back(live_[i].id);
      live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    FUZZ_CHECK(open.size() == live_.size(), "registry has ", open.size(),
               " sessions, model ", live_.size());
  }

  void AllocFor(size_t live_index, const std::string& pool, uint64_t pages) {
    v1::AllocRequest r;
    r.set_session_id(live_[live_index].id);
    r.set_pool(pool);
    r.set_num_tokens(pages * FindPool(pool)->geometry().page_size);
    auto s = handler_.Alloc(r);
    FUZZ_CHECK(s.ok(), "setup: alloc: ", s.status().ToString());
    for (const v1::PageRun& run : s->pages()) {
      for (uint64_t p = run.first_page();
           p < run.first_page() + run.num_pages(); ++p) {
        live_[live_index].pages[pool].insert(p);
      }
    }
  }

  static bool IsBasePool(const std::string& name) {
    return name == kBasePools[0] || name == kBasePools[1];
  }

  void AddLive(uint64_t id) {
    auto session = sessions_.Get(id);
    FUZZ_CHECK(session.ok(), "opened session ", id, " not found");
    SessionModel m;
    m.id = id;
    m.tag = (*session)->tag();
    live_.push_back(std::move(m));
  }

  SessionModel* FindLive(uint64_t id) {
    for (SessionModel& s : live_) {
      if (s.id == id) return &s;
    }
    return nullptr;
  }

  // Closes live_[index] through the handler (CloseSession, or EndSession as
  // the session monitor does when the socket closes) and checks the answer.
  void CloseLive(size_t index, bool expect_ok, bool end = false) {
    const SessionModel m = live_[index];
    if (end) {
      const absl::Status s = handler_.EndSession(m.id, "fuzz");
      Note(s.ok());
      FUZZ_CHECK(s.ok() || !expect_ok, "end session: ", s.ToString());
      if (!s.ok()) return;
    } else {
      v1::CloseSessionRequest r;
      r.set_session_id(m.id);
      auto s = handler_.CloseSession(r);
      Note(s.ok());
      if (!s.ok()) {
        FUZZ_CHECK(!expect_ok, "close session: ", s.status().ToString());
        return;
      }
      FUZZ_CHECK(s->pages_freed() == m.TotalPages(), "close freed ",
                 s->pages_freed(), " pages, model says ", m.TotalPages());
      FUZZ_CHECK(s->imports_closed() == m.imports.size(), "close closed ",
                 s->imports_closed(), " imports, model says ",
                 m.imports.size());
    }
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(index));
    closed_ids_.push_back(m.id);
    if (closed_ids_.size() > 4) closed_ids_.erase(closed_ids_.begin());
  }

  void CheckInvariants() {
    std::map<OwnerTag, const SessionModel*> by_tag;
    for (const SessionModel& s : live_) by_tag[s.tag] = &s;
    for (const auto& pool : pools_.List()) {
      const SlotAllocator& a = pool->allocator();
      const uint64_t free_pages = a.free_pages();
      const auto usage = a.UsageByOwner();
      uint64_t used = 0;
      for (const auto& [tag, pages] : usage) {
        used += pages;
        FUZZ_CHECK(tag != kNoOwner && pages != 0, "pool ", pool->name(),
                   ": usage entry tag=", tag, " pages=", pages);
        FUZZ_CHECK(by_tag.count(tag), "pool ", pool->name(), ": ", pages,
                   " pages owned by tag ", tag, ", which is no open session");
      }
      FUZZ_CHECK(free_pages + used == a.num_pages(), "pool ", pool->name(),
                 ": free ", free_pages, " + used ", used,
                 " != ", a.num_pages());
      for (const SessionModel& s : live_) {
        auto it = s.pages.find(pool->name());
        const uint64_t want = it == s.pages.end() ? 0 : it->second.size();
        FUZZ_CHECK(a.pages_owned_by(s.tag) == want, "pool ", pool->name(),
                   ": session tag ", s.tag, " owns ", a.pages_owned_by(s.tag),
                   " pages, model says ", want);
      }
    }
  }

  // After Quiesce: every owned page can be read (no pin left behind).
  void CheckOwnedPagesReadable() {
    for (const SessionModel& s : live_) {
      for (const auto& [pool_name, pages] : s.pages) {
        auto pool = pools_.Get(pool_name);
        FUZZ_CHECK(pool.ok(), "pool ", pool_name, " with owned pages is gone");
        const uint64_t per_call = std::max<uint64_t>(
            1, kMaxPageIoBytes / (*pool)->geometry().page_bytes());
        std::vector<uint64_t> list(pages.begin(), pages.end());
        for (size_t i = 0; i < list.size(); i += per_call) {
          v1::ReadPagesRequest r;
          r.set_session_id(s.id);
          r.set_pool(pool_name);
          for (size_t j = i; j < std::min(list.size(), i + per_call); ++j) {
            auto* run = r.add_pages();
            run->set_first_page(list[j]);
            run->set_num_pages(1);
          }
          auto got = handler_.ReadPages(r);
          if ((*pool)->geometry().page_bytes() > kMaxPageIoBytes) {
            FUZZ_CHECK(!got.ok());
          } else {
            FUZZ_CHECK(got.ok(), "idle owned pages unreadable: ",
                       got.status().ToString());
          }
        }
      }
    }
  }

  // ---- pickers ----------------------------------------------------------

  // A value of interest next to `n` (a page count, slot count, size...).
  uint64_t PickU64(uint64_t n) {
    switch (fdp_->ConsumeIntegralInRange<int>(0, 15)) {
      case 0:
        return 0;
      case 1:
        return 1;
      case 2:
        return n == 0 ? 0 : n - 1;
      case 3:
        return n;
      case 4:
        return n + 1;
      case 5:
        return kU64Max;
      case 6:
        return kU64Max - fdp_->ConsumeIntegralInRange<uint64_t>(0, 8);
      case 7:
        return kU64Max - n + 1;  // n + this wraps to 0
      case 8:
        return uint64_t{1} << 63;
      case 9:
        return std::numeric_limits<uint32_t>::max();
      case 10:
        return uint64_t{1} << fdp_->ConsumeIntegralInRange<int>(0, 63);
      case 11:
        return fdp_->ConsumeIntegral<uint64_t>();
      default:
        return fdp_->ConsumeIntegralInRange<uint64_t>(0, n + 2);
    }
  }

  // True with probability 1/n; false once the input is used up, so that the
  // tail of an input decodes to well-formed requests rather than odd ones.
  bool OneIn(int n) {
    return fdp_->ConsumeIntegralInRange<int>(0, n - 1) == n - 1;
  }

  // Index into live_, or -1.
  int PickLiveIndex() {
    if (live_.empty()) return -1;
    return static_cast<int>(
        fdp_->ConsumeIntegralInRange<size_t>(0, live_.size() - 1));
  }

  uint64_t PickSessionId() {
    const uint8_t sel = fdp_->ConsumeIntegral<uint8_t>();
    if (sel < 224 && !live_.empty()) {
      return live_[sel % live_.size()].id;
    }
    switch (sel % 4) {
      case 0:
        return 0;
      case 1:
        return closed_ids_.empty() ? 1 : closed_ids_[sel % closed_ids_.size()];
      case 2:
        return live_.empty() ? 2 : live_[0].id ^ 1;
      default:
        return fdp_->ConsumeIntegral<uint64_t>();
    }
  }

  std::string PickPoolName() {
    const uint8_t sel = fdp_->ConsumeIntegral<uint8_t>();
    const auto pools = pools_.List();
    if (sel < 200 && !pools.empty()) return pools[sel % pools.size()]->name();
    switch (sel % 6) {
      case 0:
        return kFuzzPools[sel % 3];
      case 1:
        return "";
      case 2:
        return "nope";
      case 3:
        return std::string(65, 'x');
      case 4:
        return "a/b";
      default:
        return fdp_->ConsumeRandomLengthString(80);
    }
  }

  // Page runs for `session` in `pool`: usually pages the model says it owns
  // (contiguous owned stretches), sometimes anything.
  // With `max_pages`, owned runs stop there (a transfer's device buffers
  // hold only so many rows).
  std::vector<PageRun> PickPageRuns(const SessionModel* session,
                                    const std::string& pool_name,
                                    uint64_t num_pages,
                                    uint64_t max_pages = UINT64_MAX) {
    std::vector<PageRun> runs;
    const std::set<uint64_t>* owned = nullptr;
    if (session != nullptr) {
      auto it = session->pages.find(pool_name);
      if (it != session->pages.end() && !it->second.empty())
        owned = &it->second;
    }
    const uint8_t mode = fdp_->ConsumeIntegral<uint8_t>();
    const int count =
        fdp_->ConsumeIntegralInRange<int>(mode % 16 == 15 ? 0 : 1, 4);
    if (owned != nullptr && mode < 208) {
      std::vector<uint64_t> list(owned->begin(), owned->end());
      std::set<uint64_t> used;
      uint64_t total = 0;
      for (int i = 0; i < count && total < max_pages; ++i) {
        size_t at = fdp_->ConsumeIntegralInRange<size_t>(0, list.size() - 1);
        if (used.count(list[at]) && !OneIn(8)) continue;  // mostly no repeats
        const uint64_t first = list[at];
        uint64_t n = 1;
        const uint64_t want = std::min<uint64_t>(
            fdp_->ConsumeIntegralInRange<uint64_t>(1, 16), max_pages - total);
        while (n < want && at + n < list.size() && list[at + n] == first + n &&
               !used.count(first + n)) {
          ++n;
        }
        for (uint64_t p = first; p < first + n; ++p) used.insert(p);
        runs.push_back({first, n});
        total += n;
      }
      if (OneIn(16) && !runs.empty())
        runs.back().num_pages += 1;  // one too far
      return runs;
    }
    for (int i = 0; i < count; ++i) {
      runs.push_back({PickU64(num_pages), PickU64(num_pages)});
    }
    return runs;
  }

  static void SetRuns(const std::vector<PageRun>& runs,
                      google::protobuf::RepeatedPtrField<v1::PageRun>* out) {
    for (const PageRun& r : runs) {
      v1::PageRun* p = out->Add();
      p->set_first_page(r.first_page);
      p->set_num_pages(r.num_pages);
    }
  }

  // The pages `runs` cover, if they are all in range and distinct.
  static bool DistinctPages(const std::vector<PageRun>& runs,
                            uint64_t num_pages, std::vector<uint64_t>* pages) {
    std::set<uint64_t> seen;
    for (const PageRun& r : runs) {
      if (r.num_pages == 0 || r.first_page >= num_pages ||
          r.num_pages > num_pages - r.first_page) {
        return false;
      }
      for (uint64_t p = r.first_page; p < r.first_page + r.num_pages; ++p) {
        if (!seen.insert(p).second) return false;
        if (pages != nullptr) pages->push_back(p);
      }
    }
    return !runs.empty();
  }

  static bool AllOwned(const SessionModel* s, const std::string& pool,
                       const std::vector<uint64_t>& pages) {
    if (s == nullptr) return false;
    auto it = s->pages.find(pool);
    if (it == s->pages.end()) return pages.empty();
    for (uint64_t p : pages) {
      if (!it->second.count(p)) return false;
    }
    return true;
  }

  std::shared_ptr<HostPool> FindPool(const std::string& name) {
    auto pool = pools_.Get(name);
    return pool.ok() ? *pool : nullptr;
  }

  // ---- requests ---------------------------------------------------------

  void DoAlloc() {
    v1::AllocRequest r;
    r.set_session_id(PickSessionId());
    r.set_pool(PickPoolName());
    const auto pool = FindPool(r.pool());
    const uint64_t page_size = pool ? pool->geometry().page_size : 4;
    const uint64_t free_pages = pool ? pool->allocator().free_pages() : 0;
    if (OneIn(4)) {
      r.set_num_tokens(PickU64(free_pages * page_size));
    } else {
      r.set_num_tokens(page_size *
                       fdp_->ConsumeIntegralInRange<uint64_t>(
                           1, std::min<uint64_t>(free_pages + 1, 64)));
    }
    auto s = handler_.Alloc(r);
    Note(s.ok());
    SessionModel* m = FindLive(r.session_id());
    const bool valid = m != nullptr && pool != nullptr && r.num_tokens() != 0 &&
                       r.num_tokens() % page_size == 0;
    if (!s.ok()) {
      if (valid && r.num_tokens() / page_size <= free_pages) {
        Die(absl::StrCat("Alloc of ", r.num_tokens(), " tokens refused with ",
                         free_pages, " pages free: ", s.status().ToString()));
      }
      return;
    }
    FUZZ_CHECK(valid, "Alloc accepted an invalid request: ", r.DebugString());
    std::vector<uint64_t> pages;
    FUZZ_CHECK(DistinctPages(ToRuns(s->pages()), pool->allocator().num_pages(),
                             &pages),
               "Alloc returned bad runs: ", s->DebugString());
    FUZZ_CHECK(pages.size() == r.num_tokens() / page_size, "Alloc returned ",
               pages.size(), " pages for ", r.num_tokens(), " tokens");
    for (const SessionModel& other : live_) {
      auto it = other.pages.find(r.pool());
      if (it == other.pages.end()) continue;
      for (uint64_t p : pages) {
        FUZZ_CHECK(!it->second.count(p), "Alloc returned page ", p,
                   " already owned by session tag ", other.tag);
      }
    }
    m->pages[r.pool()].insert(pages.begin(), pages.end());
  }

  void DoFree() {
    v1::FreeRequest r;
    r.set_session_id(PickSessionId());
    r.set_pool(PickPoolName());
    const auto pool = FindPool(r.pool());
    SessionModel* m = FindLive(r.session_id());
    const uint64_t num_pages = pool ? pool->allocator().num_pages() : 100;
    const std::vector<PageRun> runs = PickPageRuns(m, r.pool(), num_pages);
    SetRuns(runs, r.mutable_pages());
    std::vector<uint64_t> pages;
    const bool distinct = pool && DistinctPages(runs, num_pages, &pages);
    const bool owned = distinct && AllOwned(m, r.pool(), pages);
    auto s = handler_.Free(r);
    Note(s.ok());
    if (!s.ok()) {
      FUZZ_CHECK(!(owned && outstanding_ == 0),
                 "Free of owned idle pages refused: ", s.status().ToString(),
                 " request ", r.ShortDebugString());
      return;
    }
    FUZZ_CHECK(owned, "Free accepted pages the session does not own: ",
               r.ShortDebugString());
    FUZZ_CHECK(s->pages_freed() == pages.size(), "Free freed ",
               s->pages_freed(), " of ", pages.size());
    for (uint64_t p : pages) m->pages[r.pool()].erase(p);
  }

  // Device slot runs adding up to `tokens` within `slots` rows, mostly
  // without overlap; sometimes anything.
  std::vector<SlotSpan> PickDeviceRuns(uint64_t tokens, uint64_t slots) {
    std::vector<SlotSpan> runs;
    if (OneIn(6) || tokens == 0 || slots == 0) {
      const int count = fdp_->ConsumeIntegralInRange<int>(0, 3);
      for (int i = 0; i < count; ++i)
        runs.push_back({PickU64(slots), PickU64(tokens)});
      return runs;
    }
    // Split tokens into up to 3 pieces, placed one after another from a
    // random start (wrapping around), which never overlaps if tokens <= slots.
    uint64_t left = tokens;
    uint64_t at = fdp_->ConsumeIntegralInRange<uint64_t>(0, slots - 1);
    for (int i = 0; i < 3 && left > 0; ++i) {
      uint64_t n =
          i == 2 ? left : fdp_->ConsumeIntegralInRange<uint64_t>(1, left);
      n = std::min(n, slots - at);
      runs.push_back({at, n});
      left -= n;
      at = (at + n) % slots;
      if (OneIn(8)) at = fdp_->ConsumeIntegralInRange<uint64_t>(0, slots - 1);
    }
    if (left > 0) runs.push_back({at, left});
    return runs;
  }

  const ImportModel* PickImport(const SessionModel* m,
                                const std::string& pool) {
    if (m == nullptr) return nullptr;
    std::vector<const ImportModel*> match;
    for (const ImportModel& i : m->imports) {
      if (i.pool == pool || OneIn(16)) match.push_back(&i);
    }
    if (match.empty()) return nullptr;
    return match[fdp_->ConsumeIntegralInRange<size_t>(0, match.size() - 1)];
  }

  // Fills a transfer request; returns the model of the import it names
  // (nullptr if none).
  const ImportModel* BuildTransfer(v1::TransferRequest* r) {
    r->set_session_id(PickSessionId());
    r->set_pool(PickPoolName());
    const auto pool = FindPool(r->pool());
    const SessionModel* m = FindLive(r->session_id());
    const ImportModel* import = PickImport(m, r->pool());
    if (import != nullptr && !OneIn(32)) {
      r->set_import_id(import->id);
    } else {
      r->set_import_id(PickU64(m ? m->imports.size() + 1 : 1));
      import = nullptr;
    }
    const uint64_t num_pages = pool ? pool->allocator().num_pages() : 100;
    uint64_t max_pages = UINT64_MAX;
    if (import != nullptr && pool != nullptr && !OneIn(8)) {
      max_pages = std::max<uint64_t>(
          1, import->token_slots / pool->geometry().page_size);
    }
    const std::vector<PageRun> runs =
        PickPageRuns(m, r->pool(), num_pages, max_pages);
    SetRuns(runs, r->mutable_host_pages());
    uint64_t tokens = 0;
    if (pool != nullptr && DistinctPages(runs, num_pages, nullptr)) {
      for (const PageRun& run : runs)
        tokens += run.num_pages * pool->geometry().page_size;
    }
    const uint64_t slots = import ? import->token_slots : kMaxDeviceSlots;
    for (const SlotSpan& span : PickDeviceRuns(tokens, slots)) {
      v1::SlotRun* d = r->add_device_slots();
      d->set_first_slot(span.first);
      d->set_num_slots(span.count);
    }
    const uint32_t layers = pool ? pool->geometry().num_layers : 2;
    if (OneIn(4)) {
      r->set_layer_begin(static_cast<uint32_t>(PickU64(layers)));
      r->set_layer_end(static_cast<uint32_t>(PickU64(layers)));
    } else if (OneIn(3)) {
      const uint32_t b = fdp_->ConsumeIntegralInRange<uint32_t>(0, layers - 1);
      r->set_layer_begin(b);
      r->set_layer_end(fdp_->ConsumeIntegralInRange<uint32_t>(b + 1, layers));
    }
    const uint8_t mech = fdp_->ConsumeIntegral<uint8_t>();
    r->set_mechanism(
        static_cast<v1::CopyMechanism>(mech < 250 ? mech % 3 : mech));
    // "KV written" waits exist for CUDA imports only: always refused here.
    if (OneIn(16)) r->set_wait_kv_written(PickU64(kU64Max));
    // The flat (first, count) pair forms of the same runs, as the client
    // library sends them; now and then both forms, or an odd count.
    const uint8_t form = fdp_->ConsumeIntegral<uint8_t>();
    if (form & 1) {
      for (const v1::PageRun& run : r->host_pages()) {
        r->add_host_page_pairs(run.first_page());
        r->add_host_page_pairs(run.num_pages());
      }
      if (form < 224) r->clear_host_pages();  // else both forms: refused
    }
    if (form & 2) {
      for (const v1::SlotRun& run : r->device_slots()) {
        r->add_device_slot_pairs(run.first_slot());
        r->add_device_slot_pairs(run.num_slots());
      }
      if (form < 224) r->clear_device_slots();
    }
    if (form >= 248) {  // an odd number of values
      r->add_host_page_pairs(PickU64(num_pages));
      r->add_device_slot_pairs(PickU64(slots));
    }
    return import;
  }

  // The host runs of a transfer request, from whichever form it uses.
  static std::vector<PageRun> HostRuns(const v1::TransferRequest& r) {
    if (r.host_page_pairs_size() == 0) return ToRuns(r.host_pages());
    std::vector<PageRun> runs;
    for (int i = 0; i + 1 < r.host_page_pairs_size(); i += 2) {
      runs.push_back({r.host_page_pairs(i), r.host_page_pairs(i + 1)});
    }
    return runs;
  }

  // After an accepted transfer: waits for it, or (sometimes) lets it run.
  void AfterTransfer(uint64_t session_id, bool allow_running) {
    if (allow_running && outstanding_ < kMaxOutstanding && OneIn(4)) {
      ++outstanding_;
      return;
    }
    auto session = sessions_.Get(session_id);
    FUZZ_CHECK(session.ok());
    (*session)->signals()->AwaitIdle();
    if (outstanding_ != 0) Quiesce();
  }

  void DoTransfer(bool load) {
    v1::TransferRequest r;
    BuildTransfer(&r);
    auto s = load ? handler_.Load(r) : handler_.Backup(r);
    Note(s.ok());
    if (!s.ok()) return;
    const SessionModel* m = FindLive(r.session_id());
    FUZZ_CHECK(m != nullptr, "transfer for a closed session accepted");
    std::vector<uint64_t> pages;
    auto pool = FindPool(r.pool());
    FUZZ_CHECK(r.host_pages_size() == 0 || r.host_page_pairs_size() == 0);
    FUZZ_CHECK(r.device_slots_size() == 0 || r.device_slot_pairs_size() == 0);
    FUZZ_CHECK(r.host_page_pairs_size() % 2 == 0 &&
               r.device_slot_pairs_size() % 2 == 0);
    FUZZ_CHECK(
        pool &&
            DistinctPages(HostRuns(r), pool->allocator().num_pages(), &pages) &&
            AllOwned(m, r.pool(), pages),
        "transfer accepted pages the session does not own: ",
        r.ShortDebugString());
    FUZZ_CHECK(s->num_tokens() == pages.size() * pool->geometry().page_size);
    FUZZ_CHECK(s->signal_index() < kSignalRecords);
    FUZZ_CHECK(r.wait_kv_written() == 0,
               "a CPU import accepted wait_kv_written: ", r.ShortDebugString());
    FUZZ_CHECK(s->signal_value() == 0, "a CPU import returned a signal value");
    AfterTransfer(r.session_id(), /*allow_running=*/true);
  }

  void DoReadPages() {
    v1::ReadPagesRequest r;
    r.set_session_id(PickSessionId());
    r.set_pool(PickPoolName());
    const auto pool = FindPool(r.pool());
    const SessionModel* m = FindLive(r.session_id());
    SetRuns(
        PickPageRuns(m, r.pool(), pool ? pool->allocator().num_pages() : 100),
        r.mutable_pages());
    auto s = handler_.ReadPages(r);
    Note(s.ok());
    if (!s.ok()) return;
    FUZZ_CHECK(pool != nullptr && m != nullptr);
    uint64_t pages = 0;
    for (const v1::PageRun& run : r.pages()) {
      FUZZ_CHECK(run.num_pages() != 0 &&
                 run.first_page() < pool->allocator().num_pages() &&
                 run.num_pages() <=
                     pool->allocator().num_pages() - run.first_page());
      for (uint64_t p = run.first_page();
           p < run.first_page() + run.num_pages(); ++p) {
        FUZZ_CHECK(AllOwned(m, r.pool(), {p}), "ReadPages of unowned page ", p);
      }
      pages += run.num_pages();
    }
    FUZZ_CHECK(s->data().size() == pages * pool->geometry().page_bytes());
  }

  void DoWritePages() {
    v1::WritePagesRequest r;
    r.set_session_id(PickSessionId());
    r.set_pool(PickPoolName());
    const auto pool = FindPool(r.pool());
    const SessionModel* m = FindLive(r.session_id());
    const std::vector<PageRun> runs =
        PickPageRuns(m, r.pool(), pool ? pool->allocator().num_pages() : 100);
    SetRuns(runs, r.mutable_pages());
    uint64_t want = 0;
    std::vector<uint64_t> pages;
    if (pool != nullptr &&
        DistinctPages(runs, pool->allocator().num_pages(), &pages)) {
      want = pages.size() * pool->geometry().page_bytes();
    }
    uint64_t size = want;
    switch (fdp_->ConsumeIntegralInRange<int>(0, 7)) {
      case 5:
        size = want + 1;
        break;
      case 6:
        size = want == 0 ? 0 : want - 1;
        break;
      case 7:
        size = fdp_->ConsumeIntegralInRange<uint64_t>(0, 4096);
        break;
      default:
        break;  // exact
    }
    size = std::min<uint64_t>(size, 2 * kMaxPageIoBytes + 1);
    const uint8_t seed = fdp_->ConsumeIntegral<uint8_t>();
    std::string data(size, '\0');
    for (uint64_t i = 0; i < size; ++i)
      data[i] = static_cast<char>(seed + i * 131 + (i >> 8));
    r.set_data(data);
    auto s = handler_.WritePages(r);
    Note(s.ok());
    if (!s.ok()) return;
    FUZZ_CHECK(pool != nullptr && m != nullptr && want == size && want != 0 &&
                   AllOwned(m, r.pool(), pages) && want <= kMaxPageIoBytes,
               "WritePages accepted ", r.pages_size(), " runs, ", pages.size(),
               " distinct pages, ", size, " bytes");
    if (outstanding_ != 0) return;  // a backup in flight may write these pages
    v1::ReadPagesRequest read;
    read.set_session_id(r.session_id());
    read.set_pool(r.pool());
    *read.mutable_pages() = r.pages();
    auto back = handler_.ReadPages(read);
    FUZZ_CHECK(back.ok(),
               "ReadPages after WritePages: ", back.status().ToString());
    FUZZ_CHECK(back->data() == data,
               "ReadPages did not return what WritePages wrote (",
               pool->info().spec().ShortDebugString(), ")");
  }

  void DoGetPageBufferMeta() {
    v1::GetPageBufferMetaRequest r;
    r.set_pool(PickPoolName());
    const auto pool = FindPool(r.pool());
    const SessionModel* m = live_.empty() ? nullptr : &live_[PickLiveIndex()];
    SetRuns(
        PickPageRuns(m, r.pool(), pool ? pool->allocator().num_pages() : 100),
        r.mutable_pages());
    auto s = handler_.GetPageBufferMeta(r);
    Note(s.ok());
    if (!s.ok()) return;
    FUZZ_CHECK(pool != nullptr);
    const PoolGeometry& g = pool->geometry();
    uint64_t pages = 0;
    for (const v1::PageRun& run : r.pages()) pages += run.num_pages();
    uint64_t bytes = 0;
    for (const v1::BufferPiece& piece : s->pieces()) {
      FUZZ_CHECK(piece.size() != 0 && piece.offset() <= g.total_bytes() &&
                     piece.size() <= g.total_bytes() - piece.offset(),
                 "piece ", piece.ShortDebugString(), " outside the pool of ",
                 g.total_bytes(), " bytes");
      bytes += piece.size();
    }
    FUZZ_CHECK(bytes == pages * g.page_bytes(), "pieces cover ", bytes,
               " bytes for ", pages, " pages of ", g.page_bytes());
    FUZZ_CHECK(s->segment_name() == pool->info().segment_name());
  }

  // A well-formed registration of device_ for `pool`: token_slots rows per
  // buffer, buffers back to back from `base`.
  absl::StatusOr<v1::RegisterDeviceBuffersResponse> RegisterValid(
      size_t live_index, const std::string& pool_name, uint64_t token_slots,
      uint64_t base) {
    auto pool = FindPool(pool_name);
    FUZZ_CHECK(pool != nullptr);
    v1::RegisterDeviceBuffersRequest r;
    ImportModel model;
    BuildRegistration(*pool, token_slots, base, &r, &model);
    r.set_session_id(live_[live_index].id);
    auto s = handler_.RegisterDeviceBuffers(r);
    Note(s.ok());
    if (s.ok()) {
      model.id = s->import_id();
      live_[live_index].imports.push_back(std::move(model));
    }
    return s;
  }

  void BuildRegistration(const HostPool& pool, uint64_t token_slots,
                         uint64_t base, v1::RegisterDeviceBuffersRequest* r,
                         ImportModel* model) {
    const PoolGeometry& g = pool.geometry();
    r->set_pool(pool.name());
    r->set_token_slots(token_slots);
    model->pool = pool.name();
    model->token_slots = token_slots;
    const uint64_t buffer = token_slots * g.token_stride();
    uint64_t at = base;
    for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
      for (uint32_t l = 0; l < g.num_layers; ++l) {
        v1::DeviceBuffer* b = kv == 0 ? r->add_k_buffers() : r->add_v_buffers();
        b->set_shm_name(device_.name());
        b->set_offset(at);
        b->set_size(buffer);
        model->offsets[kv].push_back(at);
        at += buffer;
      }
    }
  }

  // Mangles one thing in a registration.
  void Mangle(v1::RegisterDeviceBuffersRequest* r, const HostPool* pool) {
    auto* list = OneIn(2) || r->v_buffers_size() == 0 ? r->mutable_k_buffers()
                                                      : r->mutable_v_buffers();
    v1::DeviceBuffer* b = list->empty()
                              ? nullptr
                              : list->Mutable(fdp_->ConsumeIntegralInRange<int>(
                                    0, list->size() - 1));
    switch (fdp_->ConsumeIntegralInRange<int>(0, 13)) {
      case 0:
        if (b) b->set_offset(PickU64(kDeviceBytes));
        break;
      case 1:
        if (b) b->set_size(PickU64(kDeviceBytes));
        break;
      case 2:
        if (b) {  // offset + size wraps
          b->set_offset(PickU64(kDeviceBytes));
          b->set_size(kU64Max - b->offset() + 1 +
                      fdp_->ConsumeIntegralInRange<uint64_t>(0, 64));
        }
        break;
      case 3:
        if (!list->empty()) list->RemoveLast();
        break;
      case 4: {
        const v1::DeviceBuffer copy =
            list->empty() ? v1::DeviceBuffer() : list->Get(0);
        *list->Add() = copy;
        break;
      }
      case 5:
        r->set_token_slots(PickU64(kMaxDeviceSlots));
        break;
      case 6:
        if (b) {
          switch (fdp_->ConsumeIntegralInRange<int>(0, 6)) {
            case 0:
              b->set_shm_name("");
              break;
            case 1:
              b->set_shm_name("relative");
              break;
            case 2:
              b->set_shm_name("/..");
              break;
            case 3:
              b->set_shm_name(pool ? pool->info().segment_name()
                                   : prefix_ + "x");
              break;
            case 4:
              b->set_shm_name(small_device_.name());
              break;
            case 5:
              b->set_shm_name(
                  absl::StrCat("/hostkv-fuzzdev.", getpid(), ".none"));
              break;
            default:
              b->set_shm_name("/" + fdp_->ConsumeRandomLengthString(210));
              break;
          }
        }
        break;
      case 7:
        if (b)
          b->set_cuda_ipc_handle(std::string(
              OneIn(2) ? 64 : fdp_->ConsumeIntegralInRange<int>(0, 80), 'h'));
        break;
      case 8:
        if (b) b->clear_handle();
        break;
      case 9:
        if (!live_.empty()) {  // another session's signal segment
          auto s = sessions_.Get(live_[0].id);
          if (s.ok() && b) b->set_shm_name((*s)->signals()->name());
        }
        break;
      case 10:
        if (b) b->set_device(fdp_->ConsumeIntegral<int32_t>());
        break;
      case 11:
        if (b) {
          b->set_device_uuid(std::string(
              fdp_->ConsumeIntegralInRange<int>(0, 20), 'u'));
        }
        break;
      case 12: {  // GPU signal words: refused without a CUDA backend
        v1::DeviceBuffer* signals = r->mutable_gpu_signals();
        if (OneIn(2)) {
          signals->set_cuda_ipc_handle(std::string(
              OneIn(2) ? 64 : fdp_->ConsumeIntegralInRange<int>(0, 80), 's'));
        } else {
          signals->set_shm_name(small_device_.name());
        }
        signals->set_offset(PickU64(kDeviceBytes));
        signals->set_size(PickU64(kDeviceBytes));
        break;
      }
      default:
        r->set_token_slots(r->token_slots() + 1);
        break;
    }
  }

  void DoRegister() {
    const uint64_t session_id = PickSessionId();
    const std::string pool_name = PickPoolName();
    const auto pool = FindPool(pool_name);
    v1::RegisterDeviceBuffersRequest r;
    ImportModel model;
    bool clean = false;
    if (pool != nullptr) {
      const PoolGeometry& g = pool->geometry();
      const uint64_t row_all = g.kv_planes() * g.num_layers * g.token_stride();
      const uint64_t fit = kDeviceBytes / row_all;
      const uint64_t slots = fdp_->ConsumeIntegralInRange<uint64_t>(
          1, std::max<uint64_t>(1, std::min(fit, kMaxDeviceSlots)));
      const uint64_t room =
          kDeviceBytes - std::min(kDeviceBytes, slots * row_all);
      const uint64_t base = fdp_->ConsumeIntegralInRange<uint64_t>(0, room);
      BuildRegistration(*pool, slots, base, &r, &model);
      clean = slots * row_all <= kDeviceBytes;
    } else {
      r.set_pool(pool_name);
      r.set_token_slots(PickU64(kMaxDeviceSlots));
    }
    r.set_session_id(session_id);
    const int mangles = OneIn(3) ? fdp_->ConsumeIntegralInRange<int>(1, 3) : 0;
    for (int i = 0; i < mangles; ++i) Mangle(&r, pool.get());
    if (mangles != 0) clean = false;
    SessionModel* m = FindLive(session_id);
    auto s = handler_.RegisterDeviceBuffers(r);
    Note(s.ok());
    if (!s.ok()) {
      FUZZ_CHECK(
          !(clean && MayRegister(m)),
          "a well-formed registration was refused: ", s.status().ToString());
      return;
    }
    FUZZ_CHECK(m != nullptr && pool != nullptr,
               "registration accepted for a closed session or pool");
    FUZZ_CHECK(MayRegister(m), "shm registration accepted for a session ",
               m->attached ? "attached with a uid that does not own the segment"
                           : "that is not attached");
    FUZZ_CHECK(!r.has_gpu_signals(),
               "a registration without a CUDA backend accepted gpu_signals");
    // What was accepted must fit where it points.
    for (const auto* list : {&r.k_buffers(), &r.v_buffers()}) {
      for (const v1::DeviceBuffer& b : *list) {
        FUZZ_CHECK(b.size() >=
                   r.token_slots() * pool->geometry().token_stride());
        const uint64_t seg = b.shm_name() == device_.name() ? kDeviceBytes
                             : b.shm_name() == small_device_.name()
                                 ? kSmallDeviceBytes
                                 : 0;
        FUZZ_CHECK(
            seg != 0 && b.offset() <= seg && b.size() <= seg - b.offset(),
            "registration accepted a buffer outside its segment: ",
            b.ShortDebugString());
      }
    }
    for (const ImportModel& i : m->imports) {
      FUZZ_CHECK(i.id != s->import_id(), "import id ", i.id,
                 " handed out twice");
    }
    if (!clean) {
      model = ImportModel();
      model.pool = pool_name;
      model.token_slots = r.token_slots();
    }
    model.id = s->import_id();
    m->imports.push_back(std::move(model));
  }

  void DoUnregister() {
    v1::UnregisterDeviceBuffersRequest r;
    r.set_session_id(PickSessionId());
    SessionModel* m = FindLive(r.session_id());
    if (m != nullptr && !m->imports.empty() && !OneIn(4)) {
      r.set_import_id(m->imports[fdp_->ConsumeIntegralInRange<size_t>(
                                     0, m->imports.size() - 1)]
                          .id);
    } else {
      r.set_import_id(PickU64(4));
    }
    auto s = handler_.UnregisterDeviceBuffers(r);
    Note(s.ok());
    bool known = false;
    if (m != nullptr) {
      for (size_t i = 0; i < m->imports.size(); ++i) {
        if (m->imports[i].id != r.import_id()) continue;
        known = true;
        if (s.ok())
          m->imports.erase(m->imports.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
    FUZZ_CHECK(s.ok() == known, "Unregister of import ", r.import_id(), ": ",
               s.status().ToString(), ", model says ",
               known ? "known" : "unknown");
  }

  void DoCreatePool() {
    v1::CreatePoolRequest r;
    v1::PoolSpec& spec = *r.mutable_spec();
    const uint8_t sel = fdp_->ConsumeIntegral<uint8_t>();
    if (sel < 32) {  // a base pool again, maybe changed
      spec = BaseSpec(sel % 2);
      if (sel & 4) spec.set_page_size(spec.page_size() + 1);
      r.set_attach_if_exists(sel & 8);
    } else {
      spec.set_name(sel < 240 ? kFuzzPools[sel % 3] : PickPoolName());
      auto* geo = spec.mutable_geometry();
      geo->set_dtype(
          static_cast<v1::Dtype>(fdp_->ConsumeIntegralInRange<int>(0, 6)));
      auto small = [&](uint32_t max) {
        return OneIn(12) ? static_cast<uint32_t>(PickU64(max))
                         : fdp_->ConsumeIntegralInRange<uint32_t>(1, max);
      };
      if (OneIn(2)) {
        auto* mha = geo->mutable_mha();
        mha->set_num_layers(small(4));
        mha->set_num_kv_heads(small(4));
        mha->set_head_dim(small(16));
      } else if (!OneIn(16)) {
        auto* mla = geo->mutable_mla();
        mla->set_num_layers(small(4));
        mla->set_kv_lora_rank(small(16));
        mla->set_qk_rope_head_dim(fdp_->ConsumeIntegralInRange<uint32_t>(0, 8));
      }
      static constexpr uint32_t kPageSizes[] = {1, 2, 3, 4, 8, 16};
      spec.set_page_size(
          OneIn(12) ? static_cast<uint32_t>(PickU64(16))
                    : kPageSizes[fdp_->ConsumeIntegralInRange<int>(0, 5)]);
      spec.set_layout(
          static_cast<v1::Layout>(fdp_->ConsumeIntegralInRange<int>(0, 6)));
      switch (fdp_->ConsumeIntegralInRange<int>(0, 7)) {
        case 0:
          spec.set_capacity_bytes(PickU64(1 << 16));
          break;
        case 1:
          spec.set_capacity_tokens(PickU64(512));
          break;
        case 2:
          break;  // none
        default:
          spec.set_capacity_tokens(
              fdp_->ConsumeIntegralInRange<uint64_t>(1, 512));
          break;
      }
      if (OneIn(4)) spec.set_device_pool_tokens(PickU64(512));
      spec.set_default_mechanism(static_cast<v1::CopyMechanism>(
          fdp_->ConsumeIntegralInRange<int>(0, 4)));
      r.set_attach_if_exists(OneIn(2));
    }
    auto s = handler_.CreatePool(r);
    Note(s.ok());
    if (!s.ok()) return;
    auto pool = FindPool(spec.name());
    FUZZ_CHECK(pool != nullptr, "created pool ", spec.name(), " not found");
    const PoolGeometry& g = pool->geometry();
    FUZZ_CHECK(g.page_size != 0 && g.token_slots % g.page_size == 0 &&
               s->num_pages() == g.num_pages() &&
               s->total_bytes() == g.total_bytes() &&
               g.total_bytes() <= kBudgetBytes);
  }

  void DoDeletePool() {
    v1::DeletePoolRequest r;
    r.set_name(PickPoolName());
    const bool existed = FindPool(r.name()) != nullptr;
    bool in_use = false;
    for (const SessionModel& s : live_) {
      auto it = s.pages.find(r.name());
      if (it != s.pages.end() && !it->second.empty()) in_use = true;
      for (const ImportModel& i : s.imports) in_use |= i.pool == r.name();
    }
    const bool engine_idle = transfers_.queued() == 0;
    auto s = handler_.DeletePool(r);
    Note(s.ok());
    if (s.ok()) {
      FUZZ_CHECK(existed && !in_use, "DeletePool of ", r.name(),
                 " in use accepted");
      for (SessionModel& m : live_) m.pages.erase(r.name());
    } else {
      FUZZ_CHECK(!(existed && !in_use && engine_idle), "DeletePool of unused ",
                 r.name(), " refused: ", s.status().ToString());
    }
  }

  void DoOpenSession() {
    v1::OpenSessionRequest r;
    r.set_client_name(
        OneIn(8)
            ? std::string(fdp_->ConsumeIntegralInRange<size_t>(250, 300), 'c')
            : fdp_->ConsumeRandomLengthString(32));
    r.set_pid(fdp_->ConsumeIntegral<uint32_t>());
    if (live_.size() >= kMaxSessions) {
      CloseLive(0, /*expect_ok=*/true);
    }
    auto s = handler_.OpenSession(r);
    Note(s.ok());
    FUZZ_CHECK(s.ok() == (r.client_name().size() <= 256),
               "OpenSession: ", s.status().ToString());
    if (!s.ok()) return;
    FUZZ_CHECK(s->signal_slots() == kSignalRecords && s->session_id() != 0);
    FUZZ_CHECK(FindLive(s->session_id()) == nullptr, "session id reused");
    AddLive(s->session_id());
  }

  void DoCloseSession() {
    const uint64_t id = PickSessionId();
    for (size_t i = 0; i < live_.size(); ++i) {
      if (live_[i].id == id) {
        CloseLive(i, /*expect_ok=*/true, /*end=*/OneIn(3));
        if (outstanding_ != 0) Quiesce();
        return;
      }
    }
    v1::CloseSessionRequest r;
    r.set_session_id(id);
    FUZZ_CHECK(!handler_.CloseSession(r).ok(), "closed unknown session ", id);
    FUZZ_CHECK(!handler_.EndSession(id, "fuzz").ok(), "ended unknown session ",
               id);
  }

  void DoAttachSession() {
    const uint64_t id = PickSessionId();
    uint32_t uid = geteuid();
    switch (fdp_->ConsumeIntegralInRange<int>(0, 7)) {
      case 6:
        uid = 0;
        break;
      case 7:
        uid = fdp_->ConsumeIntegral<uint32_t>();
        break;
      default:
        break;
    }
    Note(Attach(id, uid).ok());
  }

  // Ends the unattached sessions (a lease of zero), as the session monitor
  // does for those idle longer than the lease; copies may be in flight.
  void DoExpireIdle() {
    handler_.ExpireIdleSessions(absl::ZeroDuration());
    Note(true);
    Reconcile();
  }

  // HandOverPages: mostly owned pages to another open session.
  void DoHandOver() {
    v1::HandOverPagesRequest r;
    r.set_session_id(PickSessionId());
    r.set_pool(PickPoolName());
    SessionModel* from = FindLive(r.session_id());
    const auto pool = FindPool(r.pool());
    const uint64_t num_pages = pool ? pool->allocator().num_pages() : 100;
    const std::vector<PageRun> runs = PickPageRuns(from, r.pool(), num_pages);
    SetRuns(runs, r.mutable_pages());
    const uint8_t sel = fdp_->ConsumeIntegral<uint8_t>();
    if (sel < 224 && !live_.empty()) {
      r.set_to_session_number(live_[sel % live_.size()].tag);
    } else {
      r.set_to_session_number(sel % 2 == 0 ? kNoOwner
                                           : fdp_->ConsumeIntegral<uint32_t>());
    }
    SessionModel* to = nullptr;
    for (SessionModel& m : live_) {
      if (m.tag == r.to_session_number()) to = &m;
    }
    // Pages listed (in range; repeats allowed) and whether `from` owns all.
    std::set<uint64_t> pages;
    bool valid =
        from != nullptr && to != nullptr && pool != nullptr && !runs.empty();
    for (const PageRun& run : runs) {
      if (run.num_pages == 0 || run.first_page >= num_pages ||
          run.num_pages > num_pages - run.first_page) {
        valid = false;
        break;
      }
      for (uint64_t p = run.first_page; p < run.first_page + run.num_pages;
           ++p) {
        pages.insert(p);
      }
    }
    if (valid) {
      valid = AllOwned(from, r.pool(),
                       std::vector<uint64_t>(pages.begin(), pages.end()));
    }
    auto s = handler_.HandOverPages(r);
    Note(s.ok());
    if (!s.ok()) {
      FUZZ_CHECK(!(valid && outstanding_ == 0),
                 "HandOverPages refused: ", s.status().ToString(), " ",
                 r.ShortDebugString());
      return;
    }
    FUZZ_CHECK(valid, "HandOverPages accepted: ", r.ShortDebugString());
    // Pages listed twice move once; to the session itself nothing moves.
    const uint64_t want = from == to ? 0 : pages.size();
    FUZZ_CHECK(s->pages() == want, "HandOverPages moved ", s->pages(),
               " pages, expected ", want);
    for (uint64_t p : pages) {
      from->pages[r.pool()].erase(p);
      to->pages[r.pool()].insert(p);
    }
  }

  void DoGetPoolStats() {
    v1::GetPoolStatsRequest r;
    if (!OneIn(3)) r.set_pool(PickPoolName());
    auto s = handler_.GetPoolStats(r);
    Note(s.ok());
    if (!s.ok()) return;
    FUZZ_CHECK(s->open_sessions() == live_.size());
    FUZZ_CHECK(s->memory_reserved_bytes() <= kBudgetBytes);
    for (const v1::PoolStats& p : s->pools()) {
      FUZZ_CHECK(p.used_pages() + p.free_pages() == p.capacity_pages(),
                 p.ShortDebugString());
      uint64_t model = 0;
      for (const SessionModel& m : live_) {
        auto it = m.pages.find(p.name());
        if (it != m.pages.end()) model += it->second.size();
      }
      uint64_t listed = 0;
      for (const v1::SessionUsage& u : p.sessions()) listed += u.pages();
      FUZZ_CHECK(p.used_pages() == model && listed == model, "stats of ",
                 p.name(), ": used ", p.used_pages(), " listed ", listed,
                 " model ", model);
    }
    FUZZ_CHECK(s->sessions_size() == static_cast<int>(live_.size()));
    for (const v1::SessionInfo& info : s->sessions()) {
      const SessionModel* m = nullptr;
      for (const SessionModel& l : live_) {
        if (l.tag == info.session_number()) m = &l;
      }
      FUZZ_CHECK(m != nullptr, "stats list unknown session ",
                 info.session_number());
      FUZZ_CHECK(info.attached() == m->attached &&
                     info.pages() == m->TotalPages() &&
                     info.imports() == m->imports.size() &&
                     (!m->attached || info.uid() == m->uid),
                 "stats of session ", info.ShortDebugString(),
                 " vs model: attached ", m->attached, " pages ",
                 m->TotalPages(), " imports ", m->imports.size());
    }
  }

  // Backup device rows into owned pages, load them back elsewhere, compare.
  void DoRoundTrip() {
    if (live_.empty()) return;
    SessionModel& m = live_[PickLiveIndex()];
    std::vector<const ImportModel*> imports;
    for (const ImportModel& i : m.imports) {
      if (!i.offsets[0].empty()) imports.push_back(&i);
    }
    if (imports.empty()) return;
    const ImportModel& imp =
        *imports[fdp_->ConsumeIntegralInRange<size_t>(0, imports.size() - 1)];
    auto pool = FindPool(imp.pool);
    auto owned = m.pages.find(imp.pool);
    if (pool == nullptr || owned == m.pages.end() || owned->second.empty())
      return;
    const PoolGeometry& g = pool->geometry();
    Quiesce();
    // Host pages: a few owned pages, as many as the device rows allow.
    std::vector<PageRun> runs;
    uint64_t tokens = 0;
    for (uint64_t p : owned->second) {
      if (tokens + g.page_size > imp.token_slots) break;
      if (OneIn(3)) continue;
      runs.push_back({p, 1});
      tokens += g.page_size;
    }
    if (runs.empty()) return;
    const std::vector<SlotSpan> src = PickDeviceRuns(tokens, imp.token_slots);
    const std::vector<SlotSpan> dst = PickDeviceRuns(tokens, imp.token_slots);
    auto device_rows = [&](const std::vector<SlotSpan>& spans) {
      std::vector<uint64_t> rows;
      for (const SlotSpan& s : spans) {
        for (uint64_t t = s.first;
             t < s.first + s.count && rows.size() <= tokens; ++t)
          rows.push_back(t);
      }
      return rows;
    };
    const std::vector<uint64_t> src_rows = device_rows(src);
    const std::vector<uint64_t> dst_rows = device_rows(dst);
    if (src_rows.size() != tokens || dst_rows.size() != tokens) return;
    auto in_range = [&](const std::vector<SlotSpan>& spans) {
      for (const SlotSpan& s : spans) {
        if (s.count == 0 || s.first >= imp.token_slots ||
            s.count > imp.token_slots - s.first) {
          return false;
        }
      }
      return true;
    };
    if (!in_range(src) || !in_range(dst)) return;
    if (std::set<uint64_t>(dst_rows.begin(), dst_rows.end()).size() != tokens)
      return;

    const uint32_t lb =
        fdp_->ConsumeIntegralInRange<uint32_t>(0, g.num_layers - 1);
    const uint32_t le =
        fdp_->ConsumeIntegralInRange<uint32_t>(lb + 1, g.num_layers);
    const uint64_t stride = g.token_stride();
    auto row = [&](uint32_t kv, uint32_t l, uint64_t t) {
      return device_.data() + imp.offsets[kv][l] + t * stride;
    };
    // Fill source rows with a pattern; remember them.
    const uint8_t seed = fdp_->ConsumeIntegral<uint8_t>();
    std::vector<uint8_t> expect;
    for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
      for (uint32_t l = lb; l < le; ++l) {
        for (size_t i = 0; i < tokens; ++i) {
          uint8_t* p = row(kv, l, src_rows[i]);
          for (uint64_t b = 0; b < stride; ++b) {
            p[b] = static_cast<uint8_t>(seed + kv * 97 + l * 31 + i * 7 + b);
          }
        }
      }
    }
    for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
      for (uint32_t l = lb; l < le; ++l) {
        for (size_t i = 0; i < tokens; ++i) {
          const uint8_t* p = row(kv, l, src_rows[i]);
          expect.insert(expect.end(), p, p + stride);
        }
      }
    }
    v1::TransferRequest r;
    r.set_session_id(m.id);
    r.set_pool(imp.pool);
    r.set_import_id(imp.id);
    r.set_layer_begin(lb);
    r.set_layer_end(le);
    r.set_mechanism(static_cast<v1::CopyMechanism>(
        fdp_->ConsumeIntegralInRange<int>(0, 2)));
    SetRuns(runs, r.mutable_host_pages());
    for (const SlotSpan& s : src) {
      v1::SlotRun* d = r.add_device_slots();
      d->set_first_slot(s.first);
      d->set_num_slots(s.count);
    }
    auto backup = handler_.Backup(r);
    FUZZ_CHECK(backup.ok(), "round trip backup: ", backup.status().ToString(),
               " ", r.ShortDebugString());
    AfterTransfer(m.id, /*allow_running=*/false);
    for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
      for (uint32_t l = lb; l < le; ++l) {
        for (size_t i = 0; i < tokens; ++i)
          std::memset(row(kv, l, dst_rows[i]), 0xEE, stride);
      }
    }
    r.clear_device_slots();
    for (const SlotSpan& s : dst) {
      v1::SlotRun* d = r.add_device_slots();
      d->set_first_slot(s.first);
      d->set_num_slots(s.count);
    }
    r.set_mechanism(static_cast<v1::CopyMechanism>(
        fdp_->ConsumeIntegralInRange<int>(0, 2)));
    auto load = handler_.Load(r);
    Note(load.ok());
    FUZZ_CHECK(load.ok(), "round trip load: ", load.status().ToString());
    AfterTransfer(m.id, /*allow_running=*/false);
    size_t at = 0;
    for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
      for (uint32_t l = lb; l < le; ++l) {
        for (size_t i = 0; i < tokens; ++i, at += stride) {
          FUZZ_CHECK(std::memcmp(row(kv, l, dst_rows[i]), expect.data() + at,
                                 stride) == 0,
                     "round trip differs: plane ", kv, " layer ", l, " token ",
                     i, " pool ", pool->info().spec().ShortDebugString(),
                     " request ", r.ShortDebugString());
        }
      }
    }
  }

  const std::string prefix_;
  MemoryBudget budget_;
  PoolRegistry pools_;
  SessionRegistry sessions_;
  TransferEngine transfers_;
  RequestHandler handler_;
  ShmSegment device_;
  ShmSegment small_device_;

  FuzzedDataProvider* fdp_ = nullptr;
  std::vector<SessionModel> live_;
  std::vector<uint64_t> closed_ids_;
  int outstanding_ = 0;  // transfers accepted and not waited for
  bool last_ok_ = false;
  uint64_t calls_[kOpCount][2] = {};  // [op][succeeded]
};

Harness* harness = nullptr;

// Unlinks the shared-memory segments at a normal exit (a crash leaves them
// in /dev/shm; run_fuzzer.sh removes those).
void DestroyHarness() {
  delete harness;
  harness = nullptr;
}

}  // namespace
}  // namespace hostkv

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  hostkv::harness = new hostkv::Harness();
  std::atexit(hostkv::DestroyHarness);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hostkv::harness->RunOne(data, size);
  return 0;
}
