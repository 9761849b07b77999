// hostkvd takes every option from three sources with the same names: the
// config file's `flags` map, HOSTKVD_<NAME> environment variables, and the
// command line, in rising precedence.
#ifndef HOSTKV_SERVER_OPERATIONS_FLAG_SOURCES_H_
#define HOSTKV_SERVER_OPERATIONS_FLAG_SOURCES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hostkv {

// Returns the argument vector to parse: argv[0], then "--name=value" from the
// config file named by --config (or HOSTKVD_CONFIG), then from the
// environment for each of `flag_names`, then argv[1..]. Later arguments win.
// Returns the config file's error (naming the file) if it cannot be read or
// parsed.
absl::StatusOr<std::vector<std::string>> GatherFlagSources(
    int argc, char** argv, const std::vector<std::string>& flag_names);

// The environment variable for a flag: "memory_budget" -> HOSTKVD_MEMORY_BUDGET.
std::string FlagEnvName(const std::string& flag);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_FLAG_SOURCES_H_
