// What request_fuzzer's harness knows without asking the daemon: its limits,
// the two base pools every input starts from, who may use and delete a pool,
// and its model of what each open session owns (pages per pool,
// device-buffer registrations, passed descriptors).
#ifndef HOSTKV_TESTS_FUZZ_FUZZ_MODEL_H_
#define HOSTKV_TESTS_FUZZ_FUZZ_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "google/protobuf/repeated_ptr_field.h"
#include "hostkv/v1/hostkv.pb.h"
#include "proto/contract/shm_segment.h"
#include "server/pool/pool_registry.h"
#include "server/service/request_handler.h"
#include "server/sessions/session_registry.h"
#include "server/pool/slot_allocator.h"

namespace hostkv::fuzz {

inline constexpr int kMaxOps = 64;
inline constexpr uint32_t kSignalRecords = 4;
inline constexpr int kMaxOutstanding = 2;
inline constexpr uint64_t kBudgetBytes = 8ull << 20;
inline constexpr uint64_t kMaxPageIoBytes = 16ull << 10;
inline constexpr uint64_t kDeviceBytes = 256ull << 10;
inline constexpr uint64_t kSmallDeviceBytes = 4096;
inline constexpr uint64_t kMaxDeviceSlots = 64;
inline constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

// The daemon's limits, small so that inputs reach them.
inline constexpr uint32_t kMaxSessions = 8;
inline constexpr uint32_t kMaxSessionsPerUid = 4;
inline constexpr uint32_t kMaxUnattachedSessions = 4;
inline constexpr uint32_t kMaxPoolsPerUid = 3;
inline constexpr uint64_t kMaxPoolBytesPerUid = 1ull << 20;
inline constexpr uint32_t kMaxImportsPerSession = 2;  // and passed fds
inline constexpr uint64_t kMaxImportBytesPerSession = 320ull << 10;
inline constexpr uint32_t kMaxImportsPerUid = 5;
// Passed descriptors of all attached sessions of one uid.
inline constexpr uint32_t kMaxPassedFdsPerUid = 3;
// Pools sessions create are usable by their owner's uid and group: both
// the uid and the group branch of CheckPoolUse are reached.
inline constexpr v1::PoolAccess kPoolAccess = v1::POOL_ACCESS_GROUP;
// Uids the harness attaches as, besides its own and root: one in another
// group, one in the harness's group.
inline constexpr uint32_t kStrangerUid = 4242;
inline constexpr uint32_t kGroupmateUid = 4243;

inline constexpr const char* kBasePools[] = {"p0", "p1"};
inline constexpr const char* kFuzzPools[] = {"f0", "f1", "f2"};

// The request limits of the handler under test, with `prefix` reserved for
// the daemon's own segments.
RequestLimits MakeLimits(const std::string& prefix);
SessionLimits MakeSessionLimits();
PoolQuota MakePoolQuota();

// The spec of base pool kBasePools[which] (which is 0 or 1).
v1::PoolSpec BaseSpec(int which);
// The owner of base pool `which`: the daemon (as a --config pool), access
// OWNER for p0 and GROUP for p1.
v1::PoolOwner BaseOwner(int which);

// A descriptor the harness passed for a session: its handle, and the
// harness's own mapping of it (to fill and check device rows).
struct PassedFdModel {
  uint64_t handle = 0;
  std::shared_ptr<ShmSegment> mapping;
};

// A registration as the harness built it: where each plane of each layer
// starts in `data` (empty if the request was mangled) and the device bytes
// the daemon counts for it.
struct ImportModel {
  uint64_t id = 0;
  std::string pool;
  uint64_t token_slots = 0;
  uint64_t bytes = 0;
  uint8_t* data = nullptr;              // device_ or a passed memfd
  std::shared_ptr<ShmSegment> mapping;  // keeps a passed memfd's mapping
  std::vector<uint64_t> offsets[2];     // [kv][layer], in data
};

struct SessionModel {
  SessionId id;
  OwnerTag tag = kNoOwner;
  bool attached = false;
  uint32_t uid = 0;  // of the attached peer
  uint32_t gid = 0;
  std::map<std::string, std::set<uint64_t>> pages;  // pool -> owned pages
  // pool -> cached pages the session references (a page once per reference)
  std::map<std::string, std::multiset<uint64_t>> refs;
  std::vector<ImportModel> imports;
  std::vector<PassedFdModel> passed;
  uint64_t TotalPages() const {
    uint64_t n = 0;
    for (const auto& [pool, set] : pages) n += set.size();
    return n;
  }
  uint64_t ImportBytes() const {
    uint64_t n = 0;
    for (const ImportModel& i : imports) n += i.bytes;
    return n;
  }
  const PassedFdModel* FindPassed(uint64_t handle) const {
    for (const PassedFdModel& p : passed) {
      if (p.handle == handle) return &p;
    }
    return nullptr;
  }
};

// CheckPoolUse and CheckPoolAdmin as the contract states them, for a pool
// owned by `owner` and a request from session `m` (never null).
bool MayUsePool(const v1::PoolOwner& owner, const SessionModel& m);
bool MayAdminPool(const v1::PoolOwner& owner, const SessionModel& m);
// The owner record a pool created by `m` gets.
v1::PoolOwner OwnerOf(const SessionModel& m);
// Whether `a` and `b` count against the same PoolQuota.
bool SameQuotaOwner(const v1::PoolOwner& a, const v1::PoolOwner& b);

// The runs of a request's page list.
std::vector<PageRun> ToRuns(
    const google::protobuf::RepeatedPtrField<v1::PageRun>& in);

}  // namespace hostkv::fuzz

#endif  // HOSTKV_TESTS_FUZZ_FUZZ_MODEL_H_
