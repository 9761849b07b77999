#include "server/tier/redis_connection_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hostkv {
namespace {

std::vector<absl::StatusOr<RedisReplyPtr>> AllFailed(
    size_t n, const absl::Status& status) {
  std::vector<absl::StatusOr<RedisReplyPtr>> results;
  results.reserve(n);
  for (size_t i = 0; i < n; ++i) results.push_back(status);
  return results;
}

}  // namespace

absl::Status RedisConnectionPool::Probe() {
  absl::StatusOr<std::unique_ptr<RedisConnection>> connection = Checkout();
  if (!connection.ok()) return connection.status();
  Return(*std::move(connection));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RedisConnection>>
RedisConnectionPool::Checkout() {
  {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(
            absl::Condition(this, &RedisConnectionPool::CanCheckout),
            options_.call_timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat(address_.Describe(), ": all ", options_.max_connections,
                       " connections busy"));
    }
    if (!idle_.empty()) {
      std::unique_ptr<RedisConnection> connection = std::move(idle_.back());
      idle_.pop_back();
      return connection;
    }
    const absl::Time now = absl::Now();
    if (now < next_attempt_) {
      return absl::UnavailableError(
          absl::StrCat(address_.Describe(), ": not connected (next attempt in ",
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

void RedisConnectionPool::Return(std::unique_ptr<RedisConnection> connection) {
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

std::vector<absl::StatusOr<RedisReplyPtr>> RedisConnectionPool::RoundTrip(
    absl::Span<const RedisCommand> commands) {
  if (commands.empty()) return {};
  absl::StatusOr<std::unique_ptr<RedisConnection>> connection = Checkout();
  if (!connection.ok()) {
    return AllFailed(commands.size(), connection.status());
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
    return AllFailed(commands.size(), connection.status());
  }
  replies = (*connection)->Pipeline(commands);
  Return(*std::move(connection));
  return replies;
}

}  // namespace hostkv
