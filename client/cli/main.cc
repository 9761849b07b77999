// hostkv: command-line client of hostkvd.
//   hostkv [--target=ADDR] stats [POOL]   occupancy of every pool (or one),
//                                         with its page cache's counters
//   hostkv [--target=ADDR] pools          pools and their geometry
//   hostkv [--target=ADDR] health [SVC]   exit 0 if the daemon is SERVING
//   hostkv [--target=ADDR] lookup --pool=P --namespace=N KEY...
//                                         how many keys (hex), from the
//                                         first, the pool's cache holds
//   hostkv [--target=ADDR] demo           move pages through the daemon and
//                                         verify every byte
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "demo.h"
#include "hostkv/client.h"
#include "stats_table.h"

ABSL_FLAG(std::string, target, hostkv::kDefaultTarget,
          "hostkvd address: unix:PATH or HOST:PORT");
ABSL_FLAG(std::string, pool, "demo", "demo and lookup: pool name");
ABSL_FLAG(std::string, namespace, "",
          "lookup: the cache namespace (as the engine publishes it)");
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
    "usage: hostkv [--target=ADDR] COMMAND\n"
    "  stats [POOL]        occupancy of every pool (or one), with its page\n"
    "                      cache's counters and namespaces\n"
    "  pools               pools and their geometry\n"
    "  health [SERVICE]    exit 0 if the daemon is SERVING\n"
    "  lookup --pool=P --namespace=N KEY...\n"
    "                      how many of the keys (hex, 1..64 bytes each),\n"
    "                      from the first, are cached (takes no references)\n"
    "  demo [demo flags]   move pages through the daemon, verify every byte\n";

// `hostkv lookup`: exit 0 whatever the hits, 1 on an error, 2 on bad usage.
int Lookup(hostkv::Client& client, const std::vector<char*>& args) {
  const std::string ns = absl::GetFlag(FLAGS_namespace);
  if (ns.empty() || args.size() < 3) {
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

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      std::string("command-line client of hostkvd.\n") + kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = args[1];
  if (command == "health") {
    const std::string service = args.size() > 2 ? args[2] : "";
    auto serving = hostkv::CheckHealth(absl::GetFlag(FLAGS_target), service);
    if (!serving.ok()) {
      std::fprintf(stderr, "hostkv: %s\n", serving.status().ToString().c_str());
      return 1;
    }
    std::printf("%s\n", *serving ? "SERVING" : "NOT_SERVING");
    return *serving ? 0 : 1;
  }
  auto client =
      hostkv::Client::Connect(absl::GetFlag(FLAGS_target), "hostkv-cli");
  if (!client.ok()) {
    std::fprintf(stderr, "hostkv: %s\n", client.status().ToString().c_str());
    return 1;
  }
  if (command == "stats") {
    auto stats = (*client)->GetPoolStats(args.size() > 2 ? args[2] : "");
    if (!stats.ok()) {
      std::fprintf(stderr, "hostkv: %s\n", stats.status().ToString().c_str());
      return 1;
    }
    std::fputs(hostkv::FormatPoolStats(*stats).c_str(), stdout);
    return 0;
  }
  if (command == "pools") {
    auto pools = (*client)->ListPools();
    if (!pools.ok()) {
      std::fprintf(stderr, "hostkv: %s\n", pools.status().ToString().c_str());
      return 1;
    }
    std::fputs(hostkv::FormatPools(*pools).c_str(), stdout);
    return 0;
  }
  if (command == "lookup") return Lookup(**client, args);
  if (command == "demo") {
    hostkv::DemoOptions o;
    o.pool = absl::GetFlag(FLAGS_pool);
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
  std::fprintf(
      stderr,
      "hostkv: unknown command '%s' (stats, pools, health, lookup, demo)\n",
      command.c_str());
  return 2;
}
