#include "server/operations/flag_sources.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "hostkv/v1/hostkv.pb.h"

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

}  // namespace

std::string FlagEnvName(const std::string& flag) {
  return "HOSTKVD_" + absl::AsciiStrToUpper(flag);
}

absl::StatusOr<std::vector<std::string>> GatherFlagSources(
    int argc, char** argv, const std::vector<std::string>& flag_names) {
  std::vector<std::string> args = {argv[0]};
  const std::string config_path = FindConfigPath(argc, argv);
  if (!config_path.empty()) {
    std::ifstream file(config_path);
    if (!file) {
      return absl::NotFoundError(absl::StrCat("cannot read --config ", config_path));
    }
    std::stringstream text;
    text << file.rdbuf();
    v1::DaemonConfig config;
    if (!google::protobuf::TextFormat::ParseFromString(text.str(), &config)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--config ", config_path,
          " is not a text-format hostkv.v1.DaemonConfig (the parser's "
          "message is above)"));
    }
    for (const auto& [name, value] : config.flags()) {
      args.push_back(absl::StrCat("--", name, "=", value));
    }
    args.push_back("--config=" + config_path);
  }
  for (const std::string& name : flag_names) {
    if (const char* value = std::getenv(FlagEnvName(name).c_str())) {
      args.push_back(absl::StrCat("--", name, "=", value));
    }
  }
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  return args;
}

}  // namespace hostkv
