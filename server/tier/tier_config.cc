#include "server/tier/tier_config.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/tier/file_tier.h"
#include "spdlog/spdlog.h"
#ifdef HOSTKV_HAVE_REDIS_TIER
#include "server/tier/redis_tier.h"
#endif

namespace hostkv {
namespace {

enum class Scheme { kRedis, kRedisCluster, kRedisUnix, kFile };

struct ParsedUrl {
  Scheme scheme;
  std::string rest;  // seeds "host:port,...", or a path
};

absl::StatusOr<ParsedUrl> ParseUrl(absl::string_view url) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier=\"", url, "\": ", why,
        " (expected redis://HOST:PORT[,HOST:PORT...], "
        "redis-cluster://HOST:PORT[,...], redis+unix:/PATH or file:/PATH)"));
  };
  ParsedUrl parsed;
  absl::string_view rest = url;
  if (absl::ConsumePrefix(&rest, "redis://")) {
    parsed.scheme = Scheme::kRedis;
  } else if (absl::ConsumePrefix(&rest, "redis-cluster://")) {
    parsed.scheme = Scheme::kRedisCluster;
  } else if (absl::ConsumePrefix(&rest, "redis+unix:")) {
    parsed.scheme = Scheme::kRedisUnix;
  } else if (absl::ConsumePrefix(&rest, "file:")) {
    parsed.scheme = Scheme::kFile;
  } else {
    return bad("unknown scheme");
  }
  if (parsed.scheme == Scheme::kRedisUnix || parsed.scheme == Scheme::kFile) {
    if (!absl::StartsWith(rest, "/")) return bad("the path must be absolute");
  } else {
    if (rest.empty()) return bad("no address");
    for (absl::string_view seed : absl::StrSplit(rest, ',')) {
      const size_t colon = seed.rfind(':');
      int port = 0;
      if (colon == absl::string_view::npos || colon == 0 ||
          !absl::SimpleAtoi(seed.substr(colon + 1), &port) || port <= 0 ||
          port > 65535) {
        return bad(absl::StrCat("\"", seed, "\" is not HOST:PORT"));
      }
    }
  }
  parsed.rest = std::string(rest);
  return parsed;
}

}  // namespace

absl::Status CheckTierConfig(const TierConfig& config) {
  if (config.url.empty()) return absl::OkStatus();
  absl::StatusOr<ParsedUrl> parsed = ParseUrl(config.url);
  if (!parsed.ok()) return parsed.status();
  const auto positive = [](uint64_t value, const char* flag) {
    return value > 0 ? absl::OkStatus()
                     : absl::InvalidArgumentError(
                           absl::StrCat("--", flag, " must be at least 1"));
  };
  for (const auto& [value, flag] :
       std::vector<std::pair<uint64_t, const char*>>{
           {config.connections, "tier_connections"},
           {config.write_threads, "tier_write_threads"},
           {config.write_batch_pages, "tier_write_batch_pages"},
           {config.fetch_pages, "tier_fetch_pages"},
           {config.fetch_threads, "tier_fetch_threads"}}) {
    if (absl::Status s = positive(value, flag); !s.ok()) return s;
  }
  if (config.timeout <= absl::ZeroDuration() ||
      config.probe_interval <= absl::ZeroDuration() ||
      config.fetch_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--tier_timeout must be positive and --tier_fetch_wait not negative");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PageTier>> OpenTier(const TierConfig& config) {
  if (absl::Status s = CheckTierConfig(config); !s.ok()) return s;
  if (config.url.empty()) {
    return absl::InvalidArgumentError("no --tier URL to open");
  }
  absl::StatusOr<ParsedUrl> parsed = ParseUrl(config.url);
  if (!parsed.ok()) return parsed.status();
  if (parsed->scheme == Scheme::kFile) {
    FileTierOptions options;
    options.fsync = config.fsync;
    absl::StatusOr<std::unique_ptr<FileTier>> tier =
        FileTier::Open(parsed->rest, options);
    if (!tier.ok()) return tier.status();
    return std::unique_ptr<PageTier>(*std::move(tier));
  }
#ifdef HOSTKV_HAVE_REDIS_TIER
  RedisTierOptions options;
  options.password = config.password;
  options.connect_timeout = config.timeout;
  options.call_timeout = config.timeout;
  options.max_connections = config.connections;
  bool cluster = parsed->scheme == Scheme::kRedisCluster;
  if (parsed->scheme == Scheme::kRedisUnix) {
    options.address = "unix:" + parsed->rest;
  } else {
    options.address = parsed->rest;
    if (absl::StrContains(parsed->rest, ',')) {
      cluster = true;
    } else if (!cluster) {
      absl::StatusOr<bool> is_cluster = RedisTier::IsClusterNode(options);
      if (is_cluster.ok()) {
        cluster = *is_cluster;
      } else if (absl::IsUnauthenticated(is_cluster.status())) {
        return is_cluster.status();
      } else {
        spdlog::warn("tier {}: cannot tell whether it is a cluster ({}); "
                     "taking it as a single server (redis-cluster:// says "
                     "cluster without asking)",
                     config.url, std::string(is_cluster.status().message()));
      }
    }
  }
  absl::StatusOr<std::unique_ptr<RedisTier>> tier =
      cluster ? RedisTier::OpenCluster(options) : RedisTier::Open(options);
  if (!tier.ok()) return tier.status();
  return std::unique_ptr<PageTier>(*std::move(tier));
#else
  return absl::UnimplementedError(absl::StrCat(
      "--tier=", config.url, ": this hostkvd was built without hiredis "
      "(install libhiredis-dev and rebuild); only file: tiers are available"));
#endif
}

}  // namespace hostkv
