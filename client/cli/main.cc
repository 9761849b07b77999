// hostkv: command-line client of hostkvd.
//   hostkv [--target=ADDR] stats [POOL]   occupancy of every pool (or one),
//                                         with its page cache's counters
//   hostkv [--target=ADDR] pools          pools and their geometry
//   hostkv [--target=ADDR] health [SVC]   exit 0 if the daemon is SERVING
//   hostkv [--target=ADDR] lookup --pool=P --namespace=N KEY...
//                                         how many keys (hex), from the
//                                         first, the pool's cache holds
//   hostkv [--target=ADDR] why --pool=P --namespace=N [KEY...]
//                                         why the namespace's lookups miss:
//                                         each key (hex), its latest misses
//   hostkv [--target=ADDR] delete-pool NAME
//   hostkv [--target=ADDR] demo           move pages through the daemon and
//                                         verify every byte
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "proto/contract/build_info.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "demo.h"
#include "hostkv/client.h"
#include "stats_table.h"
#include "why_report.h"

ABSL_FLAG(std::string, target, "",
          "hostkvd address: unix:PATH, HOST:PORT or tcp:PORT (default: "
          "$HOSTKV_TARGET, else unix:/run/hostkv/hostkvd.sock)");
ABSL_FLAG(std::string, token_file, "",
          "file holding the token a TCP hostkvd requires (its "
          "--auth_token_file; default: $HOSTKV_TOKEN_FILE)");
ABSL_FLAG(std::string, pool, "",
          "lookup: the pool (required); demo: the pool it creates and "
          "deletes (default demo)");
ABSL_FLAG(std::string, namespace, "",
          "lookup, why: the cache namespace (as the engine publishes it)");
ABSL_FLAG(uint32_t, recent, 10, "why: how many of the namespace's latest misses to show");
ABSL_FLAG(std::string, attention, "mha", "demo: mha or mla");
ABSL_FLAG(std::string, layout, "page_first",
          "demo: layer_first, page_first, page_first_direct or page_head");
ABSL_FLAG(uint32_t, page_size, 16, "demo: tokens per page");
ABSL_FLAG(uint32_t, layers, 4, "demo: layers");
ABSL_FLAG(uint32_t, heads, 2, "demo: kv heads (MHA)");
ABSL_FLAG(uint32_t, head_dim, 64, "demo: head_dim (MHA) or latent dim (MLA)");
ABSL_FLAG(uint64_t, tokens, 256, "demo: tokens to move");

namespace {

constexpr char kUsage[] =
    "usage: hostkv [--target=ADDR] [--token_file=PATH] COMMAND\n"
    "  stats [POOL]        occupancy of every pool (or one), with its page\n"
    "                      cache's counters and namespaces\n"
    "  pools               pools and their geometry\n"
    "  health [SERVICE]    exit 0 if the daemon is SERVING\n"
    "  lookup --pool=P --namespace=N KEY...\n"
    "                      how many of the keys (hex, 1..64 bytes each),\n"
    "                      from the first, are cached (takes no references)\n"
    "  why --pool=P --namespace=N [--recent=10] [KEY...]\n"
    "                      why lookups of the namespace miss: each key (hex)\n"
    "                      cached or why not, and its latest misses\n"
    "  delete-pool NAME    delete a pool (as its owner or root)\n"
    "  demo [demo flags]   move pages through the daemon, verify every byte,\n"
    "                      then delete its pool\n"
    "ADDR defaults to $HOSTKV_TARGET, else unix:/run/hostkv/hostkvd.sock;\n"
    "--helpfull lists every flag.\n";

// `hostkv lookup`: exit 0 whatever the hits, 1 on an error, 2 on bad usage.
int Lookup(hostkv::Client& client, const std::vector<char*>& args) {
  const std::string ns = absl::GetFlag(FLAGS_namespace);
  if (absl::GetFlag(FLAGS_pool).empty() || ns.empty() || args.size() < 3) {
    std::fprintf(stderr,
                 "usage: hostkv lookup --pool=P --namespace=N KEY...\n");
    return 2;
  }
  std::vector<std::string> hex, keys;
  for (size_t i = 2; i < args.size(); ++i) {
    absl::StatusOr<std::string> key = hostkv::ParseHexKey(args[i]);
    if (!key.ok()) {
      std::fprintf(stderr, "hostkv lookup: %s\n",
                   std::string(key.status().message()).c_str());
      return 2;
    }
    hex.push_back(args[i]);
    keys.push_back(*std::move(key));
  }
  auto result = client.Lookup(absl::GetFlag(FLAGS_pool), ns, keys);
  if (!result.ok()) {
    std::fprintf(stderr, "hostkv: %s\n", result.status().ToString().c_str());
    return 1;
  }
  std::fputs(hostkv::FormatLookup(hex, *result).c_str(), stdout);
  return 0;
}

// `hostkv why`: exit 0 with the explanation, 1 on an error, 2 on bad usage.
int Why(hostkv::Client& client, const std::vector<char*>& args) {
  const std::string ns = absl::GetFlag(FLAGS_namespace);
  if (absl::GetFlag(FLAGS_pool).empty() || ns.empty()) {
    std::fprintf(stderr, "usage: hostkv why --pool=P --namespace=N [--recent=10] [KEY...]\n");
    return 2;
  }
  std::vector<std::string> hex, keys;
  for (size_t i = 2; i < args.size(); ++i) {
    absl::StatusOr<std::string> key = hostkv::ParseHexKey(args[i]);
    if (!key.ok()) {
      std::fprintf(stderr, "hostkv why: %s\n", std::string(key.status().message()).c_str());
      return 2;
    }
    hex.push_back(args[i]);
    keys.push_back(*std::move(key));
  }
  auto result = client.ExplainMisses(absl::GetFlag(FLAGS_pool), ns, keys,
                                     absl::GetFlag(FLAGS_recent));
  if (!result.ok()) {
    std::fprintf(stderr, "hostkv: %s\n", result.status().ToString().c_str());
    return 1;
  }
  std::fputs(hostkv::FormatWhy(ns, hex, *result).c_str(), stdout);
  return 0;
}


// --help lists the CLI's own flags (absl's default looks for a file named
// after the program and finds none).
void ConfigureHelp() {
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = [](absl::string_view file) {
    return absl::StrContains(file, "client/cli/");
  };
  config.contains_help_flags = config.contains_helpshort_flags;
  config.version_string = [] { return hostkv::BuildInfo("hostkv") + "\n"; };
  absl::SetFlagsUsageConfig(config);
}

int Report(const absl::Status& status) {
  std::fprintf(stderr, "hostkv: %s\n", status.ToString().c_str());
  return 1;
}

// --token_file (or $HOSTKV_TOKEN_FILE): the token, trailing whitespace
// stripped, as the daemon reads its --auth_token_file.
absl::StatusOr<hostkv::ConnectOptions> ReadConnectOptions() {
  hostkv::ConnectOptions options;
  std::string path = absl::GetFlag(FLAGS_token_file);
  if (path.empty() && std::getenv("HOSTKV_TOKEN_FILE") != nullptr) {
    path = std::getenv("HOSTKV_TOKEN_FILE");
  }
  if (path.empty()) return options;
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot read --token_file ", path));
  }
  char buf[4096];
  const size_t n = std::fread(buf, 1, sizeof(buf), f);
  std::fclose(f);
  options.auth_token = std::string(absl::StripTrailingAsciiWhitespace(
      absl::string_view(buf, n)));
  if (options.auth_token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--token_file ", path, " is empty"));
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      std::string("command-line client of hostkvd.\n") + kUsage);
  ConfigureHelp();
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = args[1];
  absl::StatusOr<hostkv::ConnectOptions> options = ReadConnectOptions();
  if (!options.ok()) return Report(options.status());
  const std::string target = absl::GetFlag(FLAGS_target);
  if (command == "health") {
    const std::string service = args.size() > 2 ? args[2] : "";
    auto serving = hostkv::CheckHealth(target, service, *options);
    if (!serving.ok()) return Report(serving.status());
    std::printf("%s\n", *serving ? "SERVING" : "NOT_SERVING");
    return *serving ? 0 : 1;
  }
  if (command == "delete-pool" && args.size() != 3) {
    std::fputs("usage: hostkv delete-pool NAME\n", stderr);
    return 2;
  }
  auto client = hostkv::Client::Connect(target, "hostkv-cli", *options);
  if (!client.ok()) return Report(client.status());
  if (command == "stats") {
    auto stats = (*client)->GetPoolStats(args.size() > 2 ? args[2] : "");
    if (!stats.ok()) return Report(stats.status());
    // What the daemon looked like before this command connected.
    hostkv::DropSession((*client)->session_number(), &*stats);
    std::fputs(hostkv::FormatPoolStats(*stats).c_str(), stdout);
    return 0;
  }
  if (command == "pools") {
    auto pools = (*client)->ListPools();
    if (!pools.ok()) return Report(pools.status());
    std::fputs(hostkv::FormatPools(*pools).c_str(), stdout);
    return 0;
  }
  if (command == "delete-pool") {
    if (absl::Status s = (*client)->DeletePool(args[2]); !s.ok()) return Report(s);
    std::printf("deleted pool '%s'\n", args[2]);
    return 0;
  }
  if (command == "lookup") return Lookup(**client, args);
  if (command == "why") return Why(**client, args);
  if (command == "demo") {
    hostkv::DemoOptions o;
    o.pool = absl::GetFlag(FLAGS_pool).empty() ? "demo" : absl::GetFlag(FLAGS_pool);
    o.attention = absl::GetFlag(FLAGS_attention);
    o.layout = absl::GetFlag(FLAGS_layout);
    o.page_size = absl::GetFlag(FLAGS_page_size);
    o.layers = absl::GetFlag(FLAGS_layers);
    o.heads = absl::GetFlag(FLAGS_heads);
    o.head_dim = absl::GetFlag(FLAGS_head_dim);
    o.tokens = absl::GetFlag(FLAGS_tokens);
    if (o.page_size == 0 || o.layers == 0 || o.tokens == 0 || o.head_dim < 2) {
      std::fprintf(stderr,
                   "hostkv demo: page_size, layers, tokens must be positive, "
                   "head_dim >= 2\n");
      return 2;
    }
    return hostkv::RunDemo(**client, o);
  }
  std::fprintf(stderr,
               "hostkv: unknown command '%s' (stats, pools, health, lookup, "
               "delete-pool, demo)\n",
               command.c_str());
  return 2;
}
