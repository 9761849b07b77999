#include "server/tier/redis_cluster_router.h"

#include <hiredis/hiredis.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/tier/redis_cluster_slots.h"

namespace hostkv {
namespace {

// A MOVED or ASK error reply: "MOVED 3999 127.0.0.1:6381".
struct Redirect {
  bool ask = false;
  std::string node;
};

bool ParseRedirect(const redisReply& reply, Redirect& redirect) {
  if (reply.type != REDIS_REPLY_ERROR) return false;
  const absl::string_view error(reply.str, reply.len);
  const bool moved = absl::StartsWith(error, "MOVED ");
  const bool ask = absl::StartsWith(error, "ASK ");
  if (!moved && !ask) return false;
  std::vector<absl::string_view> parts = absl::StrSplit(error, ' ');
  if (parts.size() != 3) return false;
  redirect.ask = ask;
  redirect.node = std::string(parts[2]);
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisClusterRouter>> RedisClusterRouter::Create(
    absl::string_view seeds, RedisPoolOptions options) {
  std::unique_ptr<RedisClusterRouter> router(
      new RedisClusterRouter(std::string(seeds), std::move(options)));
  for (absl::string_view seed : absl::StrSplit(seeds, ',')) {
    absl::StatusOr<RedisAddress> address = RedisAddress::Parse(seed);
    if (!address.ok() || !address->unix_path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "redis cluster seeds \"", seeds, "\": expected host:port,..."));
    }
    router->seed_pools_.push_back(router->Node(seed));
  }
  return router;
}

std::string RedisClusterRouter::Describe() const {
  return absl::StrCat("redis-cluster://", seeds_);
}

RedisConnectionPool* RedisClusterRouter::Node(absl::string_view host_port) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(host_port);
  if (it != nodes_.end()) return it->second.get();
  absl::StatusOr<RedisAddress> address = RedisAddress::Parse(host_port);
  if (!address.ok() || address->host.empty()) return nullptr;
  auto pool =
      std::make_unique<RedisConnectionPool>(*std::move(address), options_);
  RedisConnectionPool* raw = pool.get();
  nodes_.emplace(std::string(host_port), std::move(pool));
  return raw;
}

absl::Status RedisClusterRouter::RefreshSlots() {
  std::vector<RedisConnectionPool*> candidates = seed_pools_;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, pool] : nodes_) candidates.push_back(pool.get());
  }
  absl::Status last = absl::UnavailableError("no cluster node");
  const RedisCommand slots_command = {"CLUSTER", "SLOTS"};
  for (RedisConnectionPool* pool : candidates) {
    auto replies = pool->RoundTrip({&slots_command, 1});
    if (!replies[0].ok()) {
      last = replies[0].status();
      continue;
    }
    absl::StatusOr<std::vector<RedisSlotRange>> ranges =
        ParseClusterSlots(**replies[0]);
    if (!ranges.ok()) {
      last = (*replies[0])->type == REDIS_REPLY_ERROR
                 ? UnexpectedReplyStatus(**replies[0], "CLUSTER SLOTS")
                 : ranges.status();
      continue;
    }
    std::vector<RedisConnectionPool*> slots(kSlots, nullptr);
    for (const RedisSlotRange& range : *ranges) {
      RedisConnectionPool* node =
          Node(absl::StrCat(range.host, ":", range.port));
      for (int s = range.first; s <= range.last; ++s) slots[s] = node;
    }
    absl::MutexLock lock(&mu_);
    slots_ = std::move(slots);
    map_read_ = true;
    return absl::OkStatus();
  }
  return last;
}

void RedisClusterRouter::Send(
    RedisConnectionPool* pool, const std::vector<size_t>& items,
    absl::Span<const RedisCommand> commands, bool asking,
    std::vector<absl::StatusOr<RedisReplyPtr>>& replies) {
  static const RedisCommand kAsking = {"ASKING"};
  std::vector<RedisCommand> batch;
  for (size_t i : items) {
    if (asking) batch.push_back(kAsking);
    batch.push_back(commands[i]);
  }
  std::vector<absl::StatusOr<RedisReplyPtr>> got = pool->RoundTrip(batch);
  const size_t stride = asking ? 2 : 1;
  for (size_t j = 0; j < items.size(); ++j) {
    replies[items[j]] = std::move(got[j * stride + stride - 1]);
  }
}

std::vector<absl::StatusOr<RedisReplyPtr>> RedisClusterRouter::Execute(
    absl::Span<const RedisCommand> commands,
    absl::Span<const std::string> keys) {
  bool map_read;
  {
    absl::MutexLock lock(&mu_);
    map_read = map_read_;
  }
  if (!map_read) RefreshSlots().IgnoreError();
  std::vector<absl::StatusOr<RedisReplyPtr>> replies;
  replies.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    replies.push_back(absl::InternalError("redis cluster: not sent"));
  }
  // (pool, asking) -> items
  absl::flat_hash_map<std::pair<RedisConnectionPool*, bool>,
                      std::vector<size_t>>
      groups;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      RedisConnectionPool* node = slots_[RedisKeySlot(keys[i])];
      groups[{node != nullptr ? node : seed_pools_[0], false}].push_back(i);
    }
  }
  bool moved = false;
  for (int round = 0; round < 3 && !groups.empty(); ++round) {
    for (const auto& [target, items] : groups) {
      Send(target.first, items, commands, target.second, replies);
    }
    absl::flat_hash_map<std::pair<RedisConnectionPool*, bool>,
                        std::vector<size_t>>
        redirected;
    for (const auto& [target, items] : groups) {
      for (size_t i : items) {
        Redirect redirect;
        if (!replies[i].ok() || !ParseRedirect(**replies[i], redirect)) {
          continue;
        }
        RedisConnectionPool* node = Node(redirect.node);
        if (node == nullptr) continue;  // the error reply stays
        moved = moved || !redirect.ask;
        redirected[{node, redirect.ask}].push_back(i);
      }
    }
    groups = std::move(redirected);
  }
  if (moved) RefreshSlots().IgnoreError();
  return replies;
}

}  // namespace hostkv
