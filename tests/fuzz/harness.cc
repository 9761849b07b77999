// Harness: construction, the state each input starts from and ends in, and
// the dispatch of one decoded request.
#include "tests/fuzz/harness.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/pool/pool_spec.h"
#include "tests/fuzz/fuzz_check.h"

namespace hostkv::fuzz {

Harness::Harness()
    : prefix_(absl::StrCat("/hostkv-fuzz.", getpid(), ".")),
      budget_(kBudgetBytes, 0, [] { return uint64_t{1} << 40; }),
      pools_(&budget_, prefix_, PoolFillOptions{1}, /*gpu=*/nullptr, MakePoolQuota()),
      sessions_(prefix_, kSignalRecords, MakeSessionLimits(), &budget_),
      transfers_(2, /*metrics=*/nullptr),
      handler_(MakeLimits(prefix_), &budget_, &pools_, &sessions_,
               &transfers_) {
  const std::string dev = absl::StrCat("/hostkv-fuzzdev.", getpid(), ".");
  auto big = ShmSegment::Create(dev + "big", kDeviceBytes, 0600);
  auto small = ShmSegment::Create(dev + "small", kSmallDeviceBytes, 0600);
  if (!big.ok() || !small.ok()) {
    Die(absl::StrCat("cannot create device segments: ", big.status().ToString(),
                     " / ", small.status().ToString()));
  }
  device_ = std::move(*big);
  small_device_ = std::move(*small);
}

Harness::~Harness() {
  Quiesce();
  if (std::getenv("HOSTKV_FUZZ_STATS") != nullptr) PrintStats();
}

void Harness::RunOne(const uint8_t* data, size_t size) {
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

void Harness::Step() {
  const int op = fdp_->ConsumeIntegral<uint8_t>() % kOpCount;
  last_ok_ = false;
  Dispatch(op);
  ++calls_[op][last_ok_ ? 1 : 0];
}

void Harness::Dispatch(int op) {
  switch (op) {
    case kAlloc:
      return DoAlloc();
    case kPublish:
      return DoPublish();
    case kLookup:
      return DoLookup();
    case kRelease:
      return DoRelease();
    case kCopyPages:
      return DoCopyPages();
    case kListEvictions:
      return DoListEvictions();
    case kExplainMisses:
      return DoExplainMisses();
    case kSweepClaims:
      return DoSweepClaims();
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
      r.set_pool(PickPoolName());
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
      if (!CheckSessionAnswer(r.session_id(), s.status(), "RenewSession")) {
        return;
      }
      FUZZ_CHECK(s.ok(), "RenewSession: ", s.status().ToString());
      return;
    }
    case kAttachSession:
      return DoAttachSession();
    case kExpireIdle:
      return DoExpireIdle();
    case kPassFd:
      return DoPassFd();
    case kFetchPoolSegment:
      return DoFetchPoolSegment();
    default:
      return;
  }
}

// With HOSTKV_FUZZ_STATS set: how often each request ran and succeeded
// (to see whether inputs reach the interesting paths).
void Harness::PrintStats() const {
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
                                       "ExpireIdleSessions",
                                       "AcceptPassedFd",
                                       "FetchPoolSegment",
                                       "Publish",
                                       "Lookup",
                                       "Release",
                                       "CopyPages",
                                       "ListEvictions",
                                       "ExplainMisses",
                                       "SweepNamespaceClaims"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == kOpCount);
  std::fprintf(stderr, "%-24s %10s %10s\n", "request", "calls", "ok");
  for (int op = 0; op < kOpCount; ++op) {
    std::fprintf(stderr, "%-24s %10" PRIu64 " %10" PRIu64 "\n", kNames[op],
                 calls_[op][0] + calls_[op][1], calls_[op][1]);
  }
  std::fprintf(stderr,
               "imports through passed fds: %" PRIu64
               ", round trips through them: %" PRIu64
               "; requests through the command ring's entry point: %" PRIu64 "\n",
               passed_fd_imports_, passed_fd_round_trips_, ring_calls_);
}

// Waits for every copy to finish and the engine to drop its operations
// (which hold imports and pools).
void Harness::Quiesce() {
  for (const SessionModel& s : live_) {
    if (auto session = sessions_.Get(s.id); session.ok()) {
      (*session)->signals()->AwaitIdle();
    }
  }
  while (transfers_.queued() != 0) std::this_thread::yield();
  // Pages freed (evictions free many) are zeroed by each pool's scrubber
  // thread: let it finish, so that no input's end sees its allocations.
  for (const auto& pool : pools_.List()) {
    while (pool->allocator().scrubbing_pages() != 0) std::this_thread::yield();
  }
  outstanding_ = 0;
}

// Whether `pool` is a base pool as SetUp creates it. An input may have
// deleted one and created another of that name, with another owner or spec.
bool Harness::IsIntactBasePool(const HostPool& pool) const {
  for (int i = 0; i < 2; ++i) {
    if (pool.name() != kBasePools[i]) continue;
    return google::protobuf::util::MessageDifferencer::Equals(pool.owner(),
                                                              BaseOwner(i)) &&
           google::protobuf::util::MessageDifferencer::Equals(
               pool.info().spec(), NormalizePoolSpec(BaseSpec(i)));
  }
  return false;
}

// Closes every session, then deletes the pools the input created (and base
// pools it replaced) from a session attached as root (only the owner or
// root may).
void Harness::TearDown() {
  Quiesce();
  while (!live_.empty()) CloseLive(live_.size() - 1, /*expect_ok=*/true);
  closed_ids_.clear();
  CheckInvariants();
  auto admin = handler_.OpenAttachedSession(
      "teardown", PeerCredentials{static_cast<uint32_t>(getpid()), 0, 0, {}});
  FUZZ_CHECK(admin.ok(),
             "teardown: open a root session: ", admin.status().ToString());
  for (const auto& pool : pools_.List()) {
    // A base pool whose cache an input touched is replaced too: the next
    // input starts from an empty cache with no namespace claimed.
    if (IsIntactBasePool(*pool) && pool->namespaces().size() == 0 &&
        pool->allocator().cached_pages() == 0) {
      continue;
    }
    v1::DeletePoolRequest r;
    r.set_pool(pool->name());
    r.set_session_id(admin->session->id());
    auto s = handler_.DeletePool(r);
    Note(s.ok());
    FUZZ_CHECK(s.ok(), "teardown: delete pool ", pool->name(), ": ",
               s.status().ToString());
    pool_owners_.erase(pool->name());
  }
  FUZZ_CHECK(handler_.EndSession(admin->session->id(), "fuzz").ok());
}

// The state every input starts from.
void Harness::SetUp() {
  FUZZ_CHECK(live_.empty() && sessions_.List().empty());
  // The base pools are the daemon's (--config pools): they persist from
  // one input to the next unless an input deleted them.
  for (int i = 0; i < 2; ++i) {
    if (pools_.Get(kBasePools[i]).ok()) continue;
    auto s = pools_.Create(BaseSpec(i), /*attach_if_exists=*/false,
                           BaseOwner(i), Principal{});
    FUZZ_CHECK(s.ok(), "setup: create base pool: ", s.status().ToString());
    pool_owners_[kBasePools[i]] = BaseOwner(i);
  }
  for (int i = 0; i < 2; ++i) {
    v1::OpenSessionRequest r;
    r.set_client_name(i == 0 ? "alice" : "bob");
    auto s = handler_.OpenSession(r);
    Note(s.ok());
    FUZZ_CHECK(s.ok(), "setup: open session: ", s.status().ToString());
    auto session = sessions_.Get(s->session_id());
    FUZZ_CHECK(session.ok(), "opened session not found");
    AddLive(*session);
    FUZZ_CHECK(
        Attach(live_.back().id,
               PeerCredentials{
                   static_cast<uint32_t>(getpid()), geteuid(), getegid(), {}})
            .ok());
  }
  // Alice has buffers for both base pools in device_, Bob for p0 in
  // device_ and for p1 in a memfd he passed; both own a few pages, so that
  // short inputs reach the transfer and page paths.
  FUZZ_CHECK(RegisterValid(0, "p0", 16, 0, DeviceSegment()).ok());
  {
    auto s = RegisterValid(0, "p1", 32, 8192, DeviceSegment());
    FUZZ_CHECK(s.ok(), "setup: register: ", s.status().ToString());
  }
  FUZZ_CHECK(
      RegisterValid(1, "p0", kMaxDeviceSlots, 65536, DeviceSegment()).ok());
  FUZZ_CHECK(
      RegisterValid(1, "p1", 16, 4096, PassSealedMemfd(1, kDeviceBytes / 4))
          .ok());
  AllocFor(0, "p0", 6);
  AllocFor(0, "p1", 8);
  AllocFor(1, "p0", 4);
  AllocFor(1, "p1", 4);
}

}  // namespace hostkv::fuzz
