// What request_fuzzer's harness knows without asking the daemon: its limits,
// the two base pools every input starts from, and its model of what each
// open session owns (pages per pool, device-buffer registrations).
#ifndef HOSTKV_TESTS_FUZZ_FUZZ_MODEL_H_
#define HOSTKV_TESTS_FUZZ_FUZZ_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "google/protobuf/repeated_ptr_field.h"
#include "hostkv/v1/hostkv.pb.h"
#include "server/request_handler.h"
#include "server/slot_allocator.h"

namespace hostkv::fuzz {

inline constexpr int kMaxOps = 64;
inline constexpr uint32_t kSignalRecords = 4;
inline constexpr size_t kMaxSessions = 8;
inline constexpr int kMaxOutstanding = 2;
inline constexpr uint64_t kBudgetBytes = 8ull << 20;
inline constexpr uint64_t kMaxPageIoBytes = 16ull << 10;
inline constexpr uint64_t kDeviceBytes = 256ull << 10;
inline constexpr uint64_t kSmallDeviceBytes = 4096;
inline constexpr uint64_t kMaxDeviceSlots = 64;
inline constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

inline constexpr const char* kBasePools[] = {"p0", "p1"};
inline constexpr const char* kFuzzPools[] = {"f0", "f1", "f2"};

// The request limits of the handler under test, with `prefix` reserved for
// the daemon's own segments.
RequestLimits MakeLimits(const std::string& prefix);

// The spec of base pool kBasePools[which] (which is 0 or 1).
v1::PoolSpec BaseSpec(int which);

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

// The runs of a request's page list.
std::vector<PageRun> ToRuns(
    const google::protobuf::RepeatedPtrField<v1::PageRun>& in);

}  // namespace hostkv::fuzz

#endif  // HOSTKV_TESTS_FUZZ_FUZZ_MODEL_H_
