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
// Returns the config file's error (naming the file and errno's text) if it
// cannot be read or parsed, and InvalidArgument naming the source (the
// config file's key, the HOSTKVD_ variable, the command line) of a value
// that does not parse as its flag's type or of a config key that names no
// flag. Warns on stderr of HOSTKVD_ variables that name no flag. Calls
// ConfigureFlagHelp().
absl::StatusOr<std::vector<std::string>> GatherFlagSources(
    int argc, char** argv, const std::vector<std::string>& flag_names);

// Makes --help (and --helpshort) list the flags of hostkvd's own files,
// grouped by file. Call before absl::ParseCommandLine.
void ConfigureFlagHelp();

// Where the current value of flag `name` came from, when not the command
// line: "HOSTKVD_<NAME>" or "--config PATH"; "" otherwise.
std::string FlagOrigin(const std::string& name);

// `status` with " (set by HOSTKVD_X)" or " (set by --config PATH)" added
// when its message starts with "--<flag>" and that flag's value came from
// there.
absl::Status WithFlagOrigin(const absl::Status& status);

// The environment variable for a flag: "memory_budget" -> HOSTKVD_MEMORY_BUDGET.
std::string FlagEnvName(const std::string& flag);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_FLAG_SOURCES_H_
