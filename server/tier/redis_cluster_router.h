// The Redis tier's routing over a Redis Cluster (hiredis 0.14 has none): the
// slot map from CLUSTER SLOTS, a connection pool per master, MOVED (re-read
// the map, resend to the named node) and ASK (ASKING, then resend).
#ifndef HOSTKV_SERVER_TIER_REDIS_CLUSTER_ROUTER_H_
#define HOSTKV_SERVER_TIER_REDIS_CLUSTER_ROUTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/tier/redis_connection_pool.h"
#include "server/tier/redis_tier.h"

namespace hostkv {

// Thread-safe. Pools are created for the nodes the map or a redirect names
// and kept (a node that left costs one pool of idle sockets).
class RedisClusterRouter : public RedisRouter {
 public:
  // seeds: "host:port,host:port,...". Returns InvalidArgument for a
  // malformed list. Reads no map yet (Probe does).
  static absl::StatusOr<std::unique_ptr<RedisClusterRouter>> Create(
      absl::string_view seeds, RedisPoolOptions options);

  // "redis-cluster://" + the seeds.
  std::string Describe() const override;
  // Commands grouped by the master of their key's slot, one pipelined round
  // trip per node (nodes in turn); redirected items sent once more (at most
  // two redirects per item). Keys whose slot has no known master go to the
  // first seed.
  std::vector<absl::StatusOr<RedisReplyPtr>> Execute(
      absl::Span<const RedisCommand> commands,
      absl::Span<const std::string> keys) override;
  // Reads the slot map.
  absl::Status Probe() override { return RefreshSlots(); }

 private:
  RedisClusterRouter(std::string seeds, RedisPoolOptions options)
      : seeds_(std::move(seeds)),
        options_(std::move(options)),
        slots_(kSlots, nullptr) {}

  static constexpr int kSlots = 16384;

  // The pool of "host:port", created when new; nullptr if malformed.
  RedisConnectionPool* Node(absl::string_view host_port)
      ABSL_LOCKS_EXCLUDED(mu_);
  // CLUSTER SLOTS from the first node that answers: seeds, then the others.
  absl::Status RefreshSlots() ABSL_LOCKS_EXCLUDED(mu_);
  // Sends commands[i] for each i in items to pool, the replies to replies[i];
  // with asking, each command goes after an ASKING.
  void Send(RedisConnectionPool* pool, const std::vector<size_t>& items,
            absl::Span<const RedisCommand> commands, bool asking,
            std::vector<absl::StatusOr<RedisReplyPtr>>& replies);

  // Const after construction.
  const std::string seeds_;
  const RedisPoolOptions options_;
  std::vector<RedisConnectionPool*> seed_pools_;  // set by Create

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<RedisConnectionPool>> nodes_
      ABSL_GUARDED_BY(mu_);
  std::vector<RedisConnectionPool*> slots_ ABSL_GUARDED_BY(mu_);
  bool map_read_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_REDIS_CLUSTER_ROUTER_H_
