// The connections to one Redis server: at most max_connections, each used
// by one thread at a time, reconnected with backoff.
#ifndef HOSTKV_SERVER_TIER_REDIS_CONNECTION_POOL_H_
#define HOSTKV_SERVER_TIER_REDIS_CONNECTION_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/tier/redis_connection.h"

namespace hostkv {

struct RedisPoolOptions {
  std::string password;  // AUTH when not empty
  absl::Duration connect_timeout;
  absl::Duration call_timeout;  // each socket read and write
  uint32_t max_connections = 1;
  absl::Duration first_backoff;
  absl::Duration max_backoff;
};

// Thread-safe. A connection whose socket failed is dropped with the idle
// ones (they likely share its fate); the next call reconnects. After a
// failed connection attempt, calls fail fast with Unavailable until the
// backoff (first_backoff doubling to max_backoff) has passed; then one
// caller probes while the others still fail fast.
class RedisConnectionPool {
 public:
  // REQUIRES: max_connections > 0, positive timeouts and backoffs.
  RedisConnectionPool(RedisAddress address, RedisPoolOptions options)
      : address_(std::move(address)), options_(std::move(options)) {}

  const RedisAddress& address() const { return address_; }

  // Sends the commands on one connection, pipelined: one round trip. Every
  // reply's status is the connection's error when there was none
  // (Unavailable while backing off, Unauthenticated if AUTH was refused,
  // DeadlineExceeded if all connections stayed busy for call_timeout). A
  // pooled connection that fails before its first reply with Unavailable
  // (closed by a server that restarted, or by its idle timeout) is dropped
  // and the batch sent once more on a new one: callers send only idempotent
  // commands.
  std::vector<absl::StatusOr<RedisReplyPtr>> RoundTrip(
      absl::Span<const RedisCommand> commands) ABSL_LOCKS_EXCLUDED(mu_);

  // Opens a connection now if none is open; returns its error.
  absl::Status Probe() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::StatusOr<std::unique_ptr<RedisConnection>> Checkout()
      ABSL_LOCKS_EXCLUDED(mu_);
  void Return(std::unique_ptr<RedisConnection> connection)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool CanCheckout() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !idle_.empty() || open_ < options_.max_connections;
  }

  // Const after construction.
  const RedisAddress address_;
  const RedisPoolOptions options_;

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<RedisConnection>> idle_ ABSL_GUARDED_BY(mu_);
  uint32_t open_ ABSL_GUARDED_BY(mu_) = 0;  // idle + checked out + connecting
  absl::Time next_attempt_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Status last_connect_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_REDIS_CONNECTION_POOL_H_
