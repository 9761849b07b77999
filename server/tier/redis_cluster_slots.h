// Redis Cluster's key-to-slot map (used by redis_cluster_router): the slot
// of a key, and the slot map that CLUSTER SLOTS returns.
#ifndef HOSTKV_SERVER_TIER_REDIS_CLUSTER_SLOTS_H_
#define HOSTKV_SERVER_TIER_REDIS_CLUSTER_SLOTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct redisReply;

namespace hostkv {

inline constexpr int kRedisClusterSlots = 16384;

// CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with.
uint16_t RedisCrc16(absl::string_view bytes);

// The slot of a key: CRC16 of the key, or of its hash tag (the bytes
// between the first '{' and the next '}', when not empty), mod 16384.
int RedisKeySlot(absl::string_view key);

// One range of slots and the master that serves it.
struct RedisSlotRange {
  int first = 0;
  int last = 0;  // inclusive
  std::string host;
  int port = 0;
};

// The ranges of a CLUSTER SLOTS reply (replicas ignored). Returns
// InvalidArgument for a reply of any other shape (wrong types, a range out
// of 0..16383, no master), never reads past the reply.
absl::StatusOr<std::vector<RedisSlotRange>> ParseClusterSlots(
    const redisReply& reply);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_REDIS_CLUSTER_SLOTS_H_
