// Turns a client's PoolSpec into a validated PoolGeometry, sized exactly as
// SGLang sizes its host pool.
#ifndef HOSTKV_SERVER_POOL_POOL_SPEC_H_
#define HOSTKV_SERVER_POOL_POOL_SPEC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "hostkv/v1/hostkv.pb.h"
#include "kernels/copy_plan.h"
#include "kernels/pool_geometry.h"

namespace hostkv {

// Limits that keep every size computation far from overflow.
inline constexpr uint32_t kMaxLayers = 4096;
inline constexpr uint32_t kMaxHeads = 1024;
inline constexpr uint32_t kMaxHeadDim = 65536;
inline constexpr uint32_t kMaxPageSize = 65536;
inline constexpr uint32_t kMaxBlockBytes = 16u << 20;  // a blocks row
inline constexpr uint64_t kMaxPoolBytes = 1ull << 50;  // 1 PiB

// Bytes per element of `dtype`; 0 if unknown.
uint32_t DtypeSize(v1::Dtype dtype);

// True if `name` is 1..64 of [A-Za-z0-9_.-].
bool IsValidPoolName(const std::string& name);

// Validates `spec` and computes the pool's geometry:
//   tokens = capacity_tokens or floor(capacity_bytes / bytes_per_token);
//   token_slots = (tokens / page_size + 1) * page_size.
// Returns InvalidArgument naming the offending field, Unimplemented for
// LAYOUT_PAGE_FIRST_KV_SPLIT.
absl::StatusOr<PoolGeometry> ResolvePoolSpec(const v1::PoolSpec& spec);

// The spec as stored: defaults filled in (default_mechanism).
v1::PoolSpec NormalizePoolSpec(const v1::PoolSpec& spec);

// Maps a request's mechanism to the copy path's; UNSPECIFIED -> `fallback`.
// Returns InvalidArgument for values outside the enum.
absl::StatusOr<CopyMechanism> ResolveMechanism(v1::CopyMechanism mechanism,
                                               v1::CopyMechanism fallback);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_POOL_SPEC_H_
