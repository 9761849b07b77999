// Checks and converts the fields of client requests, before anything is
// touched. Everything here is pure: no daemon state.
#ifndef HOSTKV_SERVER_SERVICE_REQUEST_VALIDATION_H_
#define HOSTKV_SERVER_SERVICE_REQUEST_VALIDATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "hostkv/v1/hostkv.pb.h"
#include "kernels/copy_plan.h"
#include "server/transfer/device_import.h"
#include "server/transfer/gpu_backend.h"
#include "server/pool/slot_allocator.h"

namespace hostkv {

// Most runs one request may carry.
inline constexpr int kMaxRunsPerRequest = 1 << 20;
// Most keys one Lookup, and items one Publish, may carry: 65,536 pages are
// a 4 Mi-token prefix at 64 tokens a page, more than any engine asks at
// once, and keep one request under ~10 MB (a key is at most 64 bytes).
inline constexpr int kMaxCacheKeysPerRequest = 1 << 16;
// InvalidArgument unless 1..kMaxCacheKeysPerRequest `what` (keys, items).
absl::Status CheckCacheKeyCount(size_t count, const char* what);
// CUDA's cudaIpcMemHandle_t is 64 bytes.
inline constexpr size_t kCudaIpcHandleBytes = 64;

// Converts page runs. InvalidArgument if there are none, more than
// kMaxRunsPerRequest, or a run is empty. (Ranges are checked by the pool's
// allocator.)
absl::StatusOr<std::vector<PageRun>> ToPageRuns(
    const google::protobuf::RepeatedPtrField<v1::PageRun>& runs);

// The same for runs given as (first, count) pairs; also InvalidArgument for
// an odd count.
absl::StatusOr<std::vector<PageRun>> PairsToPageRuns(
    const google::protobuf::RepeatedField<uint64_t>& pairs);

// The host pages of a transfer, from whichever form it uses (not both).
absl::StatusOr<std::vector<PageRun>> TransferHostRuns(
    const v1::TransferRequest& request);

// InvalidArgument unless every run lies within a pool of `num_pages` pages.
absl::Status CheckRunsInPool(const std::vector<PageRun>& runs,
                             uint64_t num_pages);

// Total pages of `runs` (no overflow: each run is within a pool).
uint64_t CountPages(const std::vector<PageRun>& runs);

// Converts device slot runs and checks each against `token_slots` rows.
// InvalidArgument if none, too many, empty, or out of range.
absl::StatusOr<std::vector<SlotSpan>> ToDeviceSpans(
    const google::protobuf::RepeatedPtrField<v1::SlotRun>& runs,
    uint64_t token_slots);

// The device slots of a transfer, from whichever form it uses (not both),
// checked against `token_slots`.
absl::StatusOr<std::vector<SlotSpan>> TransferDeviceSpans(
    const v1::TransferRequest& request, uint64_t token_slots);

// InvalidArgument naming `side` if two spans overlap.
absl::Status CheckNoOverlap(std::vector<SlotSpan> spans, const char* side);

// Host token spans of page runs.
std::vector<SlotSpan> PagesToTokenSpans(const std::vector<PageRun>& runs,
                                        uint32_t page_size);

// A registration's buffers: shared-memory names (CPU backend) or CUDA IPC
// handles (CUDA backend).
struct RegistrationSpec {
  bool cuda = false;
  DeviceImportSpec shm;  // !cuda
  GpuImportSpec gpu;     // cuda
};

// Converts the buffers of a registration. InvalidArgument for a buffer
// without a handle, a registration mixing shm names and CUDA handles, a
// CUDA handle that is not 64 bytes, a device_uuid that is not 16 bytes, a
// negative device, or gpu_signals on a shared-memory registration. (Counts
// and sizes are checked against the pool by the import.)
absl::StatusOr<RegistrationSpec> ToRegistrationSpec(
    const v1::RegisterDeviceBuffersRequest& request);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SERVICE_REQUEST_VALIDATION_H_
