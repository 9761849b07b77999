#include "server/tier/redis_tier.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/tier/redis_cluster_router.h"

namespace hostkv {
namespace {

// One standalone server: every batch on one connection of its pool.
class StandaloneRouter : public RedisRouter {
 public:
  StandaloneRouter(RedisAddress address, RedisPoolOptions options)
      : pool_(std::move(address), std::move(options)) {}
  std::string Describe() const override { return pool_.address().Describe(); }
  std::vector<absl::StatusOr<RedisReplyPtr>> Execute(
      absl::Span<const RedisCommand> commands,
      absl::Span<const std::string> /*keys*/) override {
    return pool_.RoundTrip(commands);
  }
  absl::Status Probe() override { return pool_.Probe(); }

 private:
  RedisConnectionPool pool_;
};

absl::StatusOr<RedisPoolOptions> PoolOptions(const RedisTierOptions& options) {
  if (options.max_connections == 0) {
    return absl::InvalidArgumentError("redis tier: max_connections is 0");
  }
  if (options.connect_timeout <= absl::ZeroDuration() ||
      options.call_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("redis tier: timeouts must be positive");
  }
  RedisPoolOptions pool;
  pool.password = options.password;
  pool.connect_timeout = options.connect_timeout;
  pool.call_timeout = options.call_timeout;
  pool.max_connections = options.max_connections;
  pool.first_backoff = std::max(options.first_backoff, absl::Milliseconds(1));
  pool.max_backoff = std::max(options.max_backoff, pool.first_backoff);
  return pool;
}

}  // namespace

std::string RedisTierKey(const TierKey& key) {
  return absl::StrCat("hkv:", key.name_space.size(), ":", key.name_space,
                      key.key);
}

absl::StatusOr<std::unique_ptr<RedisTier>> RedisTier::Open(
    RedisTierOptions options) {
  absl::StatusOr<RedisAddress> address = RedisAddress::Parse(options.address);
  if (!address.ok()) return address.status();
  absl::StatusOr<RedisPoolOptions> pool = PoolOptions(options);
  if (!pool.ok()) return pool.status();
  return Start(std::make_unique<StandaloneRouter>(*std::move(address),
                                                  *std::move(pool)));
}

absl::StatusOr<std::unique_ptr<RedisTier>> RedisTier::OpenCluster(
    RedisTierOptions options) {
  absl::StatusOr<RedisPoolOptions> pool = PoolOptions(options);
  if (!pool.ok()) return pool.status();
  absl::StatusOr<std::unique_ptr<RedisClusterRouter>> router =
      RedisClusterRouter::Create(options.address, *std::move(pool));
  if (!router.ok()) return router.status();
  return Start(*std::move(router));
}

absl::StatusOr<std::unique_ptr<RedisTier>> RedisTier::Start(
    std::unique_ptr<RedisRouter> router) {
  // One connection now, so that a refused password shows at startup; a
  // server that is down is not an error (the tier connects when it can).
  const absl::Status probe = router->Probe();
  if (absl::IsUnauthenticated(probe)) return probe;
  return std::unique_ptr<RedisTier>(new RedisTier(std::move(router)));
}

absl::StatusOr<bool> RedisTier::IsClusterNode(const RedisTierOptions& options) {
  absl::StatusOr<RedisAddress> address = RedisAddress::Parse(options.address);
  if (!address.ok()) return address.status();
  absl::StatusOr<std::unique_ptr<RedisConnection>> connection =
      RedisConnection::Open(*address, options.password,
                            options.connect_timeout, options.call_timeout);
  if (!connection.ok()) return connection.status();
  const RedisCommand info = {"INFO", "cluster"};
  std::vector<absl::StatusOr<RedisReplyPtr>> replies =
      (*connection)->Pipeline({&info, 1});
  if (replies.size() != 1) return absl::InternalError("INFO: no reply");
  if (!replies[0].ok()) return replies[0].status();
  const redisReply& reply = **replies[0];
  if (reply.type == REDIS_REPLY_ERROR) {
    return RedisErrorReplyStatus(absl::string_view(reply.str, reply.len));
  }
  if (reply.type != REDIS_REPLY_STRING) {
    return UnexpectedReplyStatus(reply, "INFO cluster");
  }
  return absl::StrContains(absl::string_view(reply.str, reply.len),
                           "cluster_enabled:1");
}

std::string RedisTier::Describe() const { return router_->Describe(); }

std::vector<absl::StatusOr<RedisReplyPtr>> RedisTier::PerKey(
    absl::string_view verb, absl::Span<const TierKey> keys,
    absl::Span<const absl::string_view> extra) {
  std::vector<std::string> redis_keys(keys.size());
  std::vector<RedisCommand> commands(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    redis_keys[i] = RedisTierKey(keys[i]);
    commands[i] = {verb, redis_keys[i]};
    if (!extra.empty()) commands[i].push_back(extra[i]);
  }
  if (commands.empty()) return {};
  return router_->Execute(commands, redis_keys);
}

std::vector<absl::Status> RedisTier::Put(
    absl::Span<const TierKey> keys,
    absl::Span<const absl::string_view> values) {
  if (keys.size() != values.size()) {
    return std::vector<absl::Status>(
        keys.size(), absl::InvalidArgumentError(
                         "redis tier: keys and values differ in number"));
  }
  std::vector<absl::StatusOr<RedisReplyPtr>> replies =
      PerKey("SET", keys, values);
  std::vector<absl::Status> statuses(keys.size());
  for (size_t i = 0; i < replies.size(); ++i) {
    if (!replies[i].ok()) {
      statuses[i] = replies[i].status();
    } else if ((*replies[i])->type != REDIS_REPLY_STATUS) {
      statuses[i] = UnexpectedReplyStatus(**replies[i], "SET");
    }
  }
  return statuses;
}

std::vector<absl::StatusOr<std::string>> RedisTier::Get(
    absl::Span<const TierKey> keys) {
  std::vector<absl::StatusOr<RedisReplyPtr>> replies = PerKey("GET", keys);
  std::vector<absl::StatusOr<std::string>> values;
  values.reserve(keys.size());
  for (absl::StatusOr<RedisReplyPtr>& reply : replies) {
    if (!reply.ok()) {
      values.push_back(reply.status());
    } else if ((*reply)->type == REDIS_REPLY_STRING) {
      values.push_back(std::string((*reply)->str, (*reply)->len));
    } else if ((*reply)->type == REDIS_REPLY_NIL) {
      values.push_back(absl::NotFoundError("not in the redis tier"));
    } else {
      values.push_back(UnexpectedReplyStatus(**reply, "GET"));
    }
  }
  return values;
}

absl::StatusOr<uint64_t> RedisTier::CountPrefix(
    absl::Span<const TierKey> keys) {
  std::vector<absl::StatusOr<RedisReplyPtr>> replies = PerKey("EXISTS", keys);
  uint64_t count = 0;
  for (const absl::StatusOr<RedisReplyPtr>& reply : replies) {
    if (!reply.ok()) return reply.status();
    if ((*reply)->type != REDIS_REPLY_INTEGER) {
      return UnexpectedReplyStatus(**reply, "EXISTS");
    }
    if ((*reply)->integer != 1) break;
    ++count;
  }
  return count;
}

// One DEL per key (a cluster refuses a DEL across slots), pipelined.
absl::Status RedisTier::Delete(absl::Span<const TierKey> keys) {
  for (const absl::StatusOr<RedisReplyPtr>& reply : PerKey("DEL", keys)) {
    if (!reply.ok()) return reply.status();
    if ((*reply)->type != REDIS_REPLY_INTEGER) {
      return UnexpectedReplyStatus(**reply, "DEL");
    }
  }
  return absl::OkStatus();
}

}  // namespace hostkv
