// Harness: how a request's fields are chosen from the input (ids, names,
// values next to a limit, page runs) and the page-run checks the ops share.
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <set>

#include "proto/contract/session_socket.h"
#include "tests/fuzz/harness.h"

namespace hostkv::fuzz {

// A value of interest next to `n` (a page count, slot count, size...).
uint64_t Harness::PickU64(uint64_t n) {
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
bool Harness::OneIn(int n) {
  return fdp_->ConsumeIntegralInRange<int>(0, n - 1) == n - 1;
}

// Index into live_, or -1.
int Harness::PickLiveIndex() {
  if (live_.empty()) return -1;
  return static_cast<int>(
      fdp_->ConsumeIntegralInRange<size_t>(0, live_.size() - 1));
}

// Mostly an open session's id; otherwise a closed one's, an unknown
// 16-byte id, or a malformed one (another length).
SessionId Harness::PickSessionId() {
  const uint8_t sel = fdp_->ConsumeIntegral<uint8_t>();
  if (sel < 224 && !live_.empty()) {
    return live_[sel % live_.size()].id;
  }
  const SessionId some =
      live_.empty() ? SessionId(kSessionIdBytes, '\x5a') : live_[0].id;
  switch (sel % 8) {
    case 0:
      return "";
    case 1:
      return closed_ids_.empty() ? SessionId(kSessionIdBytes, '\0')
                                 : closed_ids_[sel % closed_ids_.size()];
    case 2: {  // one bit off an open session's id
      SessionId id = some;
      id[fdp_->ConsumeIntegralInRange<size_t>(0, id.size() - 1)] ^=
          static_cast<char>(1 << fdp_->ConsumeIntegralInRange<int>(0, 7));
      return id;
    }
    case 3:
      return some + '\0';  // 17 bytes
    case 4:
      return some.substr(0, kSessionIdBytes - 1);
    case 5:  // an old-style 8-byte id
      return SessionId(8, static_cast<char>(sel));
    case 6: {
      SessionId id = fdp_->ConsumeBytesAsString(kSessionIdBytes);
      id.resize(kSessionIdBytes, '\0');
      return id;
    }
    default:
      return fdp_->ConsumeRandomLengthString(24);
  }
}

// The credentials of a peer: the harness's own uid and group, root, a uid
// in another group, one in the harness's group, or any uid.
PeerCredentials Harness::PickPeer() {
  PeerCredentials peer;
  peer.pid = static_cast<uint32_t>(getpid());
  switch (fdp_->ConsumeIntegralInRange<int>(0, 7)) {
    case 4:
      peer.uid = peer.gid = 0;
      break;
    case 5:
      peer.uid = peer.gid = kStrangerUid;
      break;
    case 6:
      peer.uid = kGroupmateUid;
      peer.gid = getegid();
      break;
    case 7:
      peer.uid = fdp_->ConsumeIntegral<uint32_t>();
      peer.gid = fdp_->ConsumeIntegral<uint32_t>();
      break;
    default:
      peer.uid = geteuid();
      peer.gid = getegid();
      break;
  }
  return peer;
}

std::string Harness::PickPoolName() {
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
std::vector<PageRun> Harness::PickPageRuns(const SessionModel* session,
                                           const std::string& pool_name,
                                           uint64_t num_pages,
                                           uint64_t max_pages) {
  std::vector<PageRun> runs;
  const std::set<uint64_t>* owned = nullptr;
  if (session != nullptr) {
    auto it = session->pages.find(pool_name);
    if (it != session->pages.end() && !it->second.empty()) owned = &it->second;
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
    if (OneIn(16) && !runs.empty()) runs.back().num_pages += 1;  // one too far
    return runs;
  }
  for (int i = 0; i < count; ++i) {
    runs.push_back({PickU64(num_pages), PickU64(num_pages)});
  }
  return runs;
}

void Harness::SetRuns(const std::vector<PageRun>& runs,
                      google::protobuf::RepeatedPtrField<v1::PageRun>* out) {
  for (const PageRun& r : runs) {
    v1::PageRun* p = out->Add();
    p->set_first_page(r.first_page);
    p->set_num_pages(r.num_pages);
  }
}

// The pages `runs` cover, if they are all in range and distinct.
bool Harness::DistinctPages(const std::vector<PageRun>& runs,
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

bool Harness::AllOwned(const SessionModel* s, const std::string& pool,
                       const std::vector<uint64_t>& pages) {
  if (s == nullptr) return false;
  auto it = s->pages.find(pool);
  if (it == s->pages.end()) return pages.empty();
  for (uint64_t p : pages) {
    if (!it->second.count(p)) return false;
  }
  return true;
}

std::shared_ptr<HostPool> Harness::FindPool(const std::string& name) {
  auto pool = pools_.Get(name);
  return pool.ok() ? *pool : nullptr;
}

}  // namespace hostkv::fuzz
