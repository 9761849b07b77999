// The --tier and --tier_* flags of hostkvd (server/README.md, "Storage tiers").
#ifndef HOSTKV_SERVER_OPERATIONS_TIER_FLAGS_H_
#define HOSTKV_SERVER_OPERATIONS_TIER_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/tier/tier_config.h"

namespace hostkv {

// The flags' names (for the config file and HOSTKVD_<NAME> variables).
const std::vector<std::string>& TierFlagNames();

// The parsed flags, checked (CheckTierConfig), the password read from
// --tier_password_file; InvalidArgument naming the flag otherwise.
absl::StatusOr<TierConfig> ReadTierFlags();

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_TIER_FLAGS_H_
