#include "server/tier/redis_tier.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hostkv {
namespace {

// n results, each failed with status (also for move-only T).
template <typename T>
std::vector<T> AllFailed(size_t n, const absl::Status& status) {
  std::vector<T> results;
  results.reserve(n);
  for (size_t i = 0; i < n; ++i) results.push_back(status);
  return results;
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
  if (options.max_connections == 0) {
    return absl::InvalidArgumentError("redis tier: max_connections is 0");
  }
  if (options.connect_timeout <= absl::ZeroDuration() ||
      options.call_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("redis tier: timeouts must be positive");
  }
  options.first_backoff =
      std::max(options.first_backoff, absl::Milliseconds(1));
  options.max_backoff = std::max(options.max_backoff, options.first_backoff);
  std::unique_ptr<RedisTier> tier(
      new RedisTier(std::move(options), *std::move(address)));
  // One connection now, so that a refused password shows at startup.
  absl::StatusOr<std::unique_ptr<RedisConnection>> connection =
      tier->Checkout();
  if (connection.ok()) {
    tier->Return(*std::move(connection));
  } else if (absl::IsUnauthenticated(connection.status())) {
    return connection.status();
  }
  return tier;
}

std::string RedisTier::Describe() const { return address_.Describe(); }

absl::StatusOr<std::unique_ptr<RedisConnection>> RedisTier::Checkout() {
  {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(this, &RedisTier::CanCheckout),
                              options_.call_timeout)) {
      return absl::DeadlineExceededError(absl::StrCat(
          Describe(), ": all ", options_.max_connections, " connections busy"));
    }
    if (!idle_.empty()) {
      std::unique_ptr<RedisConnection> connection = std::move(idle_.back());
      idle_.pop_back();
      return connection;
    }
    const absl::Time now = absl::Now();
    if (now < next_attempt_) {
      return absl::UnavailableError(
          absl::StrCat(Describe(), ": not connected (next attempt in ",
                       absl::FormatDuration(next_attempt_ - now),
                       "; last error: ", last_connect_error_.message(), ")"));
    }
    // While backing off, one caller probes and the others fail fast.
    if (backoff_ > absl::ZeroDuration()) next_attempt_ = now + backoff_;
    ++open_;
  }
  absl::StatusOr<std::unique_ptr<RedisConnection>> connection =
      RedisConnection::Open(address_, options_.password,
                            options_.connect_timeout, options_.call_timeout);
  absl::MutexLock lock(&mu_);
  if (!connection.ok()) {
    --open_;
    backoff_ = backoff_ == absl::ZeroDuration()
                   ? options_.first_backoff
                   : std::min(2 * backoff_, options_.max_backoff);
    next_attempt_ = absl::Now() + backoff_;
    last_connect_error_ = connection.status();
    return connection.status();
  }
  backoff_ = absl::ZeroDuration();
  next_attempt_ = absl::InfinitePast();
  last_connect_error_ = absl::OkStatus();
  return connection;
}

void RedisTier::Return(std::unique_ptr<RedisConnection> connection) {
  std::vector<std::unique_ptr<RedisConnection>> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (!connection->broken()) {
      idle_.push_back(std::move(connection));
      return;
    }
    dropped.swap(idle_);
    open_ -= static_cast<uint32_t>(dropped.size()) + 1;
  }
  // Closed outside the lock.
}

std::vector<absl::StatusOr<RedisReplyPtr>> RedisTier::RoundTrip(
    absl::Span<const RedisCommand> commands) {
  if (commands.empty()) return {};
  absl::StatusOr<std::unique_ptr<RedisConnection>> connection = Checkout();
  if (!connection.ok()) {
    return AllFailed<absl::StatusOr<RedisReplyPtr>>(commands.size(),
                                                    connection.status());
  }
  const bool reused = (*connection)->used();
  std::vector<absl::StatusOr<RedisReplyPtr>> replies =
      (*connection)->Pipeline(commands);
  const bool stale = reused && (*connection)->broken() &&
                     absl::IsUnavailable(replies[0].status());
  Return(*std::move(connection));
  if (!stale) return replies;
  connection = Checkout();
  if (!connection.ok()) {
    return AllFailed<absl::StatusOr<RedisReplyPtr>>(commands.size(),
                                                    connection.status());
  }
  replies = (*connection)->Pipeline(commands);
  Return(*std::move(connection));
  return replies;
}

std::vector<absl::Status> RedisTier::Put(
    absl::Span<const TierKey> keys,
    absl::Span<const absl::string_view> values) {
  if (keys.size() != values.size()) {
    return AllFailed<absl::Status>(
        keys.size(), absl::InvalidArgumentError("redis tier: keys and values "
                                                "differ in number"));
  }
  std::vector<std::string> redis_keys(keys.size());
  std::vector<RedisCommand> commands(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    redis_keys[i] = RedisTierKey(keys[i]);
    commands[i] = {"SET", redis_keys[i], values[i]};
  }
  std::vector<absl::StatusOr<RedisReplyPtr>> replies = RoundTrip(commands);
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
  std::vector<std::string> redis_keys(keys.size());
  std::vector<RedisCommand> commands(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    redis_keys[i] = RedisTierKey(keys[i]);
    commands[i] = {"GET", redis_keys[i]};
  }
  std::vector<absl::StatusOr<RedisReplyPtr>> replies = RoundTrip(commands);
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
  std::vector<std::string> redis_keys(keys.size());
  std::vector<RedisCommand> commands(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    redis_keys[i] = RedisTierKey(keys[i]);
    commands[i] = {"EXISTS", redis_keys[i]};
  }
  std::vector<absl::StatusOr<RedisReplyPtr>> replies = RoundTrip(commands);
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

absl::Status RedisTier::Delete(absl::Span<const TierKey> keys) {
  if (keys.empty()) return absl::OkStatus();
  std::vector<std::string> redis_keys(keys.size());
  RedisCommand command = {"DEL"};
  for (size_t i = 0; i < keys.size(); ++i) {
    redis_keys[i] = RedisTierKey(keys[i]);
    command.push_back(redis_keys[i]);
  }
  std::vector<absl::StatusOr<RedisReplyPtr>> replies = RoundTrip({&command, 1});
  if (!replies[0].ok()) return replies[0].status();
  if ((*replies[0])->type != REDIS_REPLY_INTEGER) {
    return UnexpectedReplyStatus(**replies[0], "DEL");
  }
  return absl::OkStatus();
}

}  // namespace hostkv
