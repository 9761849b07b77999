// The Redis tier (issue 14): pages stored in a standalone Redis server or a
// Redis Cluster, through hiredis.
#ifndef HOSTKV_SERVER_TIER_REDIS_TIER_H_
#define HOSTKV_SERVER_TIER_REDIS_TIER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/tier/page_tier.h"
#include "server/tier/redis_connection.h"
#include "server/tier/redis_connection_pool.h"

namespace hostkv {

struct RedisTierOptions {
  // "host:port" or "unix:/path"; for OpenCluster, seeds "host:port,...".
  std::string address;
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

// Where the tier's commands go: one server, or a cluster's nodes by slot.
// Thread-safe.
class RedisRouter {
 public:
  virtual ~RedisRouter() = default;
  virtual std::string Describe() const = 0;
  // One reply per command; commands[i] is about the Redis key keys[i] (the
  // key decides the node in a cluster). One round trip per node.
  virtual std::vector<absl::StatusOr<RedisReplyPtr>> Execute(
      absl::Span<const RedisCommand> commands,
      absl::Span<const std::string> keys) = 0;
  // Connects now; returns the error (Unauthenticated for a refused AUTH).
  virtual absl::Status Probe() = 0;
};

// The tier on Redis: one command per item (SET, GET, EXISTS, DEL), a batch
// pipelined in one round trip (per node in a cluster) through a connection
// pool per server (redis_connection_pool.h: at most max_connections, one
// thread per connection, reconnection with backoff). Thread-safe. Replies
// map to statuses, never crash: nil -> NotFound (Get), Redis' error replies
// by RedisErrorReplyStatus, any other reply type -> Internal.
class RedisTier : public PageTier {
 public:
  // Returns InvalidArgument for a malformed address or max_connections 0,
  // Unauthenticated if the server refused the password. A server that is
  // down is not an error here: the tier connects when it comes up.
  static absl::StatusOr<std::unique_ptr<RedisTier>> Open(
      RedisTierOptions options);
  // A Redis Cluster: options.address lists seed nodes, "host:port,..."; the
  // slot map comes from CLUSTER SLOTS, MOVED re-reads it, ASK is followed.
  // max_connections is per node.
  static absl::StatusOr<std::unique_ptr<RedisTier>> OpenCluster(
      RedisTierOptions options);

  // Whether the one server at options.address runs in cluster mode (INFO
  // cluster says cluster_enabled:1); Unavailable / DeadlineExceeded if it
  // cannot be asked now, Unauthenticated for a refused password.
  static absl::StatusOr<bool> IsClusterNode(const RedisTierOptions& options);

  std::string Describe() const override;
  std::vector<absl::Status> Put(
      absl::Span<const TierKey> keys,
      absl::Span<const absl::string_view> values) override;
  std::vector<absl::StatusOr<std::string>> Get(
      absl::Span<const TierKey> keys) override;
  absl::StatusOr<uint64_t> CountPrefix(absl::Span<const TierKey> keys) override;
  absl::Status Delete(absl::Span<const TierKey> keys) override;

 private:
  explicit RedisTier(std::unique_ptr<RedisRouter> router)
      : router_(std::move(router)) {}
  static absl::StatusOr<std::unique_ptr<RedisTier>> Start(
      std::unique_ptr<RedisRouter> router);

  // Pipelines one command per key (each names the key once, after the
  // verb, then extra arguments) and returns one reply per key.
  std::vector<absl::StatusOr<RedisReplyPtr>> PerKey(
      absl::string_view verb, absl::Span<const TierKey> keys,
      absl::Span<const absl::string_view> extra = {});

  const std::unique_ptr<RedisRouter> router_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_REDIS_TIER_H_
