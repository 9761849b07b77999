#include "server/tier/redis_cluster_slots.h"

#include <hiredis/hiredis.h>

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

// The values CLUSTER KEYSLOT gave on redis-server 7.0.15 (Debian 12).
TEST(RedisKeySlotTest, MatchesRedis) {
  EXPECT_EQ(0x31C3, RedisCrc16("123456789"));
  EXPECT_EQ(12182, RedisKeySlot("foo"));
  EXPECT_EQ(5061, RedisKeySlot("bar"));
  EXPECT_EQ(12739, RedisKeySlot("123456789"));
  EXPECT_EQ(3443, RedisKeySlot("{user1000}.following"));
  EXPECT_EQ(13694, RedisKeySlot("a{}b"));  // an empty tag hashes the key
  EXPECT_EQ(10595, RedisKeySlot("{}x"));
  EXPECT_EQ(12222, RedisKeySlot("x{y}z"));  // the tag "y"
  EXPECT_EQ(2693, RedisKeySlot("hkv:2:nsk"));
  EXPECT_EQ(0, RedisKeySlot(""));
  EXPECT_EQ(RedisKeySlot("y"), RedisKeySlot("x{y}z"));
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// A reply as hiredis parses the RESP text.
Reply Parse(const std::string& resp) {
  redisReader* reader = redisReaderCreate();
  redisReaderFeed(reader, resp.data(), resp.size());
  void* reply = nullptr;
  const int rc = redisReaderGetReply(reader, &reply);
  redisReaderFree(reader);
  EXPECT_EQ(REDIS_OK, rc);
  EXPECT_NE(nullptr, reply) << "incomplete RESP";
  return Reply(static_cast<redisReply*>(reply));
}

TEST(ParseClusterSlotsTest, RangesAndMasters) {
  Reply reply = Parse(
      "*2\r\n"
      "*4\r\n:0\r\n:8191\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n"
      "*3\r\n$9\r\n127.0.0.1\r\n:7003\r\n$3\r\nid2\r\n"
      "*3\r\n:8192\r\n:16383\r\n*2\r\n$9\r\n127.0.0.2\r\n:7001\r\n");
  ASSERT_NE(nullptr, reply);
  auto ranges = ParseClusterSlots(*reply);
  ASSERT_OK(ranges);
  ASSERT_EQ(2u, ranges->size());
  EXPECT_EQ(0, (*ranges)[0].first);
  EXPECT_EQ(8191, (*ranges)[0].last);
  EXPECT_EQ("127.0.0.1", (*ranges)[0].host);
  EXPECT_EQ(7000, (*ranges)[0].port);
  EXPECT_EQ(8192, (*ranges)[1].first);
  EXPECT_EQ(16383, (*ranges)[1].last);
  EXPECT_EQ("127.0.0.2", (*ranges)[1].host);
  EXPECT_EQ(7001, (*ranges)[1].port);
}

TEST(ParseClusterSlotsTest, MalformedRepliesAreInvalidArgument) {
  for (const std::string& resp : {
           std::string("$-1\r\n"),                            // nil
           std::string("-ERR cluster support disabled\r\n"),  // error
           std::string(":3\r\n"),                             // integer
           std::string("*1\r\n:1\r\n"),              // range not an array
           std::string("*1\r\n*2\r\n:0\r\n:1\r\n"),  // no master
           std::string("*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n"),
           std::string("*1\r\n*3\r\n:9\r\n:1\r\n*2\r\n$1\r\nh\r\n:1\r\n"),
           std::string("*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n:1\r\n:1\r\n"),
           std::string("*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\nh\r\n:0\r\n"),
           std::string("*1\r\n*3\r\n:0\r\n:1\r\n*1\r\n$1\r\nh\r\n"),
           std::string("*1\r\n*3\r\n:0\r\n:1\r\n$-1\r\n"),
       }) {
    Reply reply = Parse(resp);
    ASSERT_NE(nullptr, reply) << resp;
    EXPECT_ERROR(InvalidArgument, ParseClusterSlots(*reply));
  }
  Reply empty = Parse("*0\r\n");
  auto ranges = ParseClusterSlots(*empty);
  ASSERT_OK(ranges);
  EXPECT_TRUE(ranges->empty());
}

}  // namespace
}  // namespace hostkv
