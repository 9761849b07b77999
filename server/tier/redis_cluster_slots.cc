#include "server/tier/redis_cluster_slots.h"

#include <hiredis/hiredis.h>

#include "absl/strings/str_cat.h"

namespace hostkv {

uint16_t RedisCrc16(absl::string_view bytes) {
  uint16_t crc = 0;
  for (unsigned char byte : bytes) {
    crc ^= static_cast<uint16_t>(byte) << 8;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc;
}

int RedisKeySlot(absl::string_view key) {
  const size_t open = key.find('{');
  if (open != absl::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != absl::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return RedisCrc16(key) & (kRedisClusterSlots - 1);
}

namespace {

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed CLUSTER SLOTS reply: ", why));
}

bool IsSlot(const redisReply* r) {
  return r != nullptr && r->type == REDIS_REPLY_INTEGER && r->integer >= 0 &&
         r->integer < kRedisClusterSlots;
}

}  // namespace

absl::StatusOr<std::vector<RedisSlotRange>> ParseClusterSlots(
    const redisReply& reply) {
  if (reply.type != REDIS_REPLY_ARRAY) return Malformed("not an array");
  std::vector<RedisSlotRange> ranges;
  for (size_t i = 0; i < reply.elements; ++i) {
    const redisReply* range = reply.element[i];
    if (range == nullptr || range->type != REDIS_REPLY_ARRAY ||
        range->elements < 3) {
      return Malformed("a range is not [first, last, master, ...]");
    }
    if (!IsSlot(range->element[0]) || !IsSlot(range->element[1]) ||
        range->element[0]->integer > range->element[1]->integer) {
      return Malformed("a range's slots are out of 0..16383");
    }
    const redisReply* master = range->element[2];
    if (master == nullptr || master->type != REDIS_REPLY_ARRAY ||
        master->elements < 2 || master->element[0] == nullptr ||
        master->element[0]->type != REDIS_REPLY_STRING ||
        master->element[1] == nullptr ||
        master->element[1]->type != REDIS_REPLY_INTEGER ||
        master->element[1]->integer <= 0 ||
        master->element[1]->integer > 65535) {
      return Malformed("a range's master is not [host, port, ...]");
    }
    ranges.push_back(
        {static_cast<int>(range->element[0]->integer),
         static_cast<int>(range->element[1]->integer),
         std::string(master->element[0]->str, master->element[0]->len),
         static_cast<int>(master->element[1]->integer)});
  }
  return ranges;
}

}  // namespace hostkv
