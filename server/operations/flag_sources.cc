#include "server/operations/flag_sources.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "google/protobuf/text_format.h"
#include "hostkv/v1/hostkv.pb.h"
#include "proto/contract/build_info.h"
#include "proto/contract/status_macros.h"
#include "server/transfer/gpu_backend.h"

namespace hostkv {
namespace {

// The value of --config / -config (either spelling, "=" or next argument).
std::string FindConfigPath(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    for (const char* prefix : {"--config=", "-config="}) {
      if (absl::StartsWith(arg, prefix)) return arg.substr(std::strlen(prefix));
    }
    if ((arg == "--config" || arg == "-config") && i + 1 < argc) return argv[i + 1];
  }
  const char* env = std::getenv("HOSTKVD_CONFIG");
  return env == nullptr ? "" : env;
}

// Reads --config's text; NotFound/PermissionDenied with the errno's text.
absl::StatusOr<std::string> ReadConfigText(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    const int error = errno;
    return absl::Status(error == ENOENT ? absl::StatusCode::kNotFound
                                        : absl::StatusCode::kPermissionDenied,
                        absl::StrCat("cannot read --config ", path, ": ",
                                     std::strerror(error)));
  }
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// InvalidArgument naming `origin` if `value` does not parse as flag `name`'s
// type (durations with an example: absl says only "Illegal value").
absl::Status CheckFlagValue(const std::string& name, const std::string& value,
                            const std::string& origin) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": no hostkvd flag named '", name, "'"));
  }
  std::string error;
  bool ok = true;
  const char* expected = "";
  if (flag->IsOfType<absl::Duration>()) {
    absl::Duration d;
    ok = absl::ParseDuration(value, &d);
    expected = "a duration such as 30s, 500ms or 10m";
  } else if (flag->IsOfType<int>()) {
    int i;
    ok = absl::ParseFlag(value, &i, &error);
    expected = "an integer";
  } else if (flag->IsOfType<bool>()) {
    bool b;
    ok = absl::ParseFlag(value, &b, &error);
    expected = "true or false";
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      origin, ": --", name, "=", value, " is not ", expected));
}

// "--name=value" / "-name=value" -> name and value; false for other forms.
bool SplitFlagArg(const std::string& arg, std::string* name, std::string* value) {
  if (!absl::StartsWith(arg, "-")) return false;
  const std::string body = arg.substr(absl::StartsWith(arg, "--") ? 2 : 1);
  const size_t eq = body.find('=');
  if (eq == std::string::npos) return false;
  *name = body.substr(0, eq);
  *value = body.substr(eq + 1);
  return true;
}

// Warns (stderr: logging is not set up yet) of HOSTKVD_* variables that name
// no flag. Kubernetes' service variables (HOSTKVD_SERVICE_*, HOSTKVD_PORT*,
// for a Service named hostkvd) and the test hook HOSTKVD_CRASH_AT are not
// flags and not warned of.
void WarnOfUnknownVariables(const std::vector<std::string>& flag_names) {
  for (char** env = environ; *env != nullptr; ++env) {
    const std::string entry = *env;
    if (!absl::StartsWith(entry, "HOSTKVD_")) continue;
    const std::string var = entry.substr(0, entry.find('='));
    if (var == "HOSTKVD_CONFIG" || var == "HOSTKVD_CRASH_AT" ||
        absl::StartsWith(var, "HOSTKVD_SERVICE_") ||
        absl::StartsWith(var, "HOSTKVD_PORT")) {
      continue;
    }
    bool known = false;
    for (const std::string& name : flag_names) known |= FlagEnvName(name) == var;
    if (!known) {
      std::fprintf(stderr,
                   "hostkvd: warning: %s names no hostkvd flag and is ignored "
                   "(hostkvd --help lists the flags; HOSTKVD_<FLAG> in capitals)\n",
                   var.c_str());
    }
  }
}

}  // namespace

void ConfigureFlagHelp() {
  absl::FlagsUsageConfig config;
  // --help lists every flag of the project's own files, grouped by file
  // (absl's default would list only flags of a file named after the program).
  config.contains_helpshort_flags = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/");
  };
  config.contains_help_flags = config.contains_helpshort_flags;
  config.normalize_filename = [](absl::string_view file) {
    for (const char* top : {"server/", "client/"}) {
      const size_t at = file.rfind(top);
      if (at != absl::string_view::npos) return std::string(file.substr(at));
    }
    return std::string(file);
  };
  config.version_string = [] {
    return absl::StrCat(BuildInfo("hostkvd"), "\n", DescribeGpuSupport(), "\n");
  };
  absl::SetFlagsUsageConfig(config);
}

std::string FlagOrigin(const std::string& name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) return "";
  const std::string current = flag->CurrentValue();
  const char* env = std::getenv(FlagEnvName(name).c_str());
  if (env != nullptr && current == env) return FlagEnvName(name);
  const absl::CommandLineFlag* config_flag = absl::FindCommandLineFlag("config");
  const std::string path = config_flag == nullptr ? "" : config_flag->CurrentValue();
  if (path.empty()) return "";
  absl::StatusOr<std::string> text = ReadConfigText(path);
  v1::DaemonConfig config;
  if (!text.ok() || !google::protobuf::TextFormat::ParseFromString(*text, &config)) {
    return "";
  }
  auto it = config.flags().find(name);
  if (it == config.flags().end() || it->second != current) return "";
  return absl::StrCat("--config ", path);
}

absl::Status WithFlagOrigin(const absl::Status& status) {
  const absl::string_view message = status.message();
  if (!absl::StartsWith(message, "--")) return status;
  size_t end = 2;
  while (end < message.size() &&
         (absl::ascii_isalnum(message[end]) || message[end] == '_')) {
    ++end;
  }
  const std::string origin = FlagOrigin(std::string(message.substr(2, end - 2)));
  if (origin.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(message, " (set by ", origin, ")"));
}

std::string FlagEnvName(const std::string& flag) {
  return "HOSTKVD_" + absl::AsciiStrToUpper(flag);
}

absl::StatusOr<std::vector<std::string>> GatherFlagSources(
    int argc, char** argv, const std::vector<std::string>& flag_names) {
  ConfigureFlagHelp();
  std::vector<std::string> args = {argv[0]};
  const std::string config_path = FindConfigPath(argc, argv);
  WarnOfUnknownVariables(flag_names);
  if (!config_path.empty()) {
    absl::StatusOr<std::string> text = ReadConfigText(config_path);
    if (!text.ok()) return text.status();
    v1::DaemonConfig config;
    if (!google::protobuf::TextFormat::ParseFromString(*text, &config)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--config ", config_path,
          " is not a text-format hostkv.v1.DaemonConfig (the parser's "
          "message is above)"));
    }
    for (const auto& [name, value] : config.flags()) {
      RETURN_IF_ERROR(CheckFlagValue(
          name, value, absl::StrCat("--config ", config_path, ", flags[\"", name, "\"]")));
      args.push_back(absl::StrCat("--", name, "=", value));
    }
    args.push_back("--config=" + config_path);
  }
  for (const std::string& name : flag_names) {
    if (const char* value = std::getenv(FlagEnvName(name).c_str())) {
      RETURN_IF_ERROR(CheckFlagValue(name, value, FlagEnvName(name)));
      args.push_back(absl::StrCat("--", name, "=", value));
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::string name, value;
    if (SplitFlagArg(argv[i], &name, &value) &&
        absl::FindCommandLineFlag(name) != nullptr) {
      RETURN_IF_ERROR(CheckFlagValue(name, value, "the command line"));
    }
    args.push_back(argv[i]);
  }
  return args;
}

}  // namespace hostkv
