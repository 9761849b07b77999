// Names reserved to one user: a pool or a cache namespace whose name begins
// with "uid<N>." (N in decimal, without leading zeros) can be created or
// first published in only by an attached session of uid N (not root, not an
// unverified session). Engines derive their names from the model and layout,
// which anyone can compute: hostkv's adapters put their uid in front, so no
// other user can take such a name first and have the engine attach to its
// pool or be refused its namespace (README, "Trust model").
#ifndef HOSTKV_SERVER_POOL_RESERVED_NAMES_H_
#define HOSTKV_SERVER_POOL_RESERVED_NAMES_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace hostkv {

struct Principal;  // server/pool/pool_access.h

// N when `name` begins with "uid<N>." (N a uint32 without leading zeros),
// else nullopt.
std::optional<uint32_t> ReservedUid(absl::string_view name);

// OK unless `name` is reserved to a uid other than `who`'s (or `who` is
// unverified): PermissionDenied naming both. `what`: "pool" or "cache
// namespace", for the message.
absl::Status CheckReservedName(absl::string_view what, absl::string_view name,
                               const Principal& who);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_RESERVED_NAMES_H_
