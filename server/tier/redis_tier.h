// The Redis tier (issue 14): pages stored in one standalone Redis server
// through hiredis. Redis Cluster is not handled yet (a MOVED or ASK reply is
// an Internal error of that item).
#ifndef HOSTKV_SERVER_TIER_REDIS_TIER_H_
#define HOSTKV_SERVER_TIER_REDIS_TIER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/tier/page_tier.h"
#include "server/tier/redis_connection.h"

namespace hostkv {

struct RedisTierOptions {
  std::string address;   // "host:port" or "unix:/path"
  std::string password;  // AUTH when not empty
  absl::Duration connect_timeout = absl::Milliseconds(500);
  // Applies to each read and write on the socket (hiredis' SO_RCVTIMEO and
  // SO_SNDTIMEO): a batch whose bytes keep flowing may take longer.
  absl::Duration call_timeout = absl::Seconds(2);
  uint32_t max_connections = 8;
  // Between failed connection attempts: doubling from the first to the max.
  absl::Duration first_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
};

// The Redis key of (namespace, key): "hkv:" + the namespace's length in
// decimal + ":" + namespace + key. Binary-safe and unambiguous (the length
// says where the namespace ends).
std::string RedisTierKey(const TierKey& key);

// Owns a pool of at most max_connections connections, each used by one
// thread at a time (checked out for a call, returned after). Thread-safe.
//
// Every batch is one pipelined round trip. A connection whose socket failed
// is dropped with the idle ones (they likely share its fate); the next call
// reconnects. After a failed connection attempt, calls fail fast with
// Unavailable until the backoff has passed.
class RedisTier : public PageTier {
 public:
  // Returns InvalidArgument for a malformed address or max_connections 0,
  // Unauthenticated if the server refused the password. A server that is
  // down is not an error here: the tier connects when it comes up.
  static absl::StatusOr<std::unique_ptr<RedisTier>> Open(
      RedisTierOptions options);

  std::string Describe() const override;
  std::vector<absl::Status> Put(
      absl::Span<const TierKey> keys,
      absl::Span<const absl::string_view> values) override;
  std::vector<absl::StatusOr<std::string>> Get(
      absl::Span<const TierKey> keys) override;
  absl::StatusOr<uint64_t> CountPrefix(absl::Span<const TierKey> keys) override;
  absl::Status Delete(absl::Span<const TierKey> keys) override;

 private:
  RedisTier(RedisTierOptions options, RedisAddress address)
      : options_(std::move(options)), address_(std::move(address)) {}

  // A connection for one call: an idle one, or a new one while fewer than
  // max_connections are open. Waits at most call_timeout for one to be
  // returned (DeadlineExceeded). Unavailable while backing off.
  absl::StatusOr<std::unique_ptr<RedisConnection>> Checkout()
      ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps the connection for the next call, or drops it (and the idle ones)
  // when it is broken.
  void Return(std::unique_ptr<RedisConnection> connection)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Checkout + Pipeline + Return; every reply's status is the checkout's
  // error when there was no connection. A pooled connection that fails
  // before its first reply with Unavailable (closed by a server that
  // restarted, or by its idle timeout) is dropped and the batch sent once
  // more on a new one (every command the tier sends is idempotent).
  std::vector<absl::StatusOr<RedisReplyPtr>> RoundTrip(
      absl::Span<const RedisCommand> commands) ABSL_LOCKS_EXCLUDED(mu_);
  bool CanCheckout() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !idle_.empty() || open_ < options_.max_connections;
  }

  // Const after construction.
  const RedisTierOptions options_;
  const RedisAddress address_;

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<RedisConnection>> idle_ ABSL_GUARDED_BY(mu_);
  uint32_t open_ ABSL_GUARDED_BY(mu_) = 0;  // idle + checked out + connecting
  absl::Time next_attempt_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Status last_connect_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_REDIS_TIER_H_
