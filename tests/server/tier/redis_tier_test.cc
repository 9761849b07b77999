#include "server/tier/redis_tier.h"

#include <hiredis/hiredis.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/server/tier/redis_server_process.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

using ::hostkv::testing::RedisServerProcess;

// Deterministic bytes of one page, different for each seed.
std::string Page(uint64_t seed, size_t size) {
  std::string page(size, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    page[i] = static_cast<char>(x);
  }
  return page;
}

std::vector<TierKey> Keys(const std::string& name_space, int n,
                          const std::string& tag = "") {
  std::vector<TierKey> keys;
  for (int i = 0; i < n; ++i) {
    keys.push_back({name_space, absl::StrCat("key-", tag, i)});
  }
  return keys;
}

// One item's result, by value (an element of a temporary vector would
// dangle inside the EXPECT macros).
absl::StatusOr<std::string> GetOne(PageTier& tier, const TierKey& key) {
  return std::move(tier.Get({key})[0]);
}

// The count, or ~0 (and a failure) if the call failed.
uint64_t Count(PageTier& tier, const std::vector<TierKey>& keys) {
  absl::StatusOr<uint64_t> count = tier.CountPrefix(keys);
  EXPECT_TRUE(count.ok()) << count.status();
  return count.ok() ? *count : ~uint64_t{0};
}

std::vector<absl::string_view> Views(const std::vector<std::string>& values) {
  return std::vector<absl::string_view>(values.begin(), values.end());
}

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RedisServerProcess::FindBinary().empty()) {
      GTEST_SKIP() << "redis-server is not installed";
    }
    ASSERT_OK(server_.Start(Password()));
  }
  virtual std::string Password() const { return ""; }

  absl::StatusOr<std::unique_ptr<RedisTier>> Open(
      uint32_t max_connections = 4, const std::string& password = "") {
    return RedisTier::Open({server_.address(), password, absl::Seconds(1),
                            absl::Seconds(5), max_connections});
  }
  std::unique_ptr<RedisTier> OpenOrDie(uint32_t max_connections = 4) {
    auto tier = Open(max_connections, Password());
    EXPECT_OK(tier);
    return tier.ok() ? *std::move(tier) : nullptr;
  }

  // Puts and checks that every item succeeded.
  static void PutAll(PageTier& tier, const std::vector<TierKey>& keys,
                     const std::vector<std::string>& values) {
    std::vector<absl::Status> statuses = tier.Put(keys, Views(values));
    ASSERT_EQ(keys.size(), statuses.size());
    for (const absl::Status& s : statuses) ASSERT_OK(s);
  }
  // Gets and compares the bytes with values.
  static void ExpectValues(PageTier& tier, const std::vector<TierKey>& keys,
                           const std::vector<std::string>& values) {
    std::vector<absl::StatusOr<std::string>> got = tier.Get(keys);
    ASSERT_EQ(keys.size(), got.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_OK(got[i]);
      ASSERT_EQ(values[i].size(), got[i]->size()) << i;
      ASSERT_TRUE(*got[i] == values[i]) << "bytes differ at item " << i;
    }
  }

  // A command sent behind the tier's back; the reply's type.
  int RawCommand(const std::vector<std::string>& args) {
    return testing::RawRedisCommand(server_.socket_path(), args).type;
  }

  RedisServerProcess server_;
};

TEST_F(RedisTierTest, PagesRoundTrip) {
  auto tier = OpenOrDie();
  ASSERT_NE(nullptr, tier);
  EXPECT_EQ("redis+unix:" + server_.socket_path(), tier->Describe());
  const std::vector<TierKey> keys = Keys("llama/tp0", 4);
  std::vector<std::string> pages;
  for (int i = 0; i < 4; ++i) pages.push_back(Page(i, 1 << 20));
  PutAll(*tier, keys, pages);
  ExpectValues(*tier, keys, pages);
  EXPECT_EQ(4u, Count(*tier, keys));

  ASSERT_OK(tier->Delete({keys[1]}));
  EXPECT_EQ(1u, Count(*tier, keys));
  EXPECT_ERROR(NotFound, GetOne(*tier, keys[1]));
  ExpectValues(*tier, {keys[0], keys[2], keys[3]},
               {pages[0], pages[2], pages[3]});

  // Put replaces.
  PutAll(*tier, {keys[0]}, {pages[3]});
  ExpectValues(*tier, {keys[0]}, {pages[3]});
}

TEST_F(RedisTierTest, MissesAndEmptyBatches) {
  auto tier = OpenOrDie();
  ASSERT_NE(nullptr, tier);
  const std::vector<TierKey> keys = Keys("ns", 4);
  EXPECT_EQ(0u, Count(*tier, keys));
  EXPECT_ERROR(NotFound, GetOne(*tier, keys[2]));
  PutAll(*tier, {keys[0], keys[1], keys[3]}, {"a", "b", "d"});
  EXPECT_EQ(2u, Count(*tier, keys));  // keys[2] is the gap
  // An empty value is a value.
  PutAll(*tier, {keys[2]}, {""});
  EXPECT_EQ(4u, Count(*tier, keys));
  ExpectValues(*tier, {keys[2]}, {""});

  EXPECT_TRUE(tier->Put({}, {}).empty());
  EXPECT_TRUE(tier->Get({}).empty());
  EXPECT_EQ(0u, Count(*tier, {}));
  EXPECT_OK(tier->Delete({}));
  EXPECT_OK(tier->Delete(Keys("never-written", 3)));  // absent keys are fine
}

TEST_F(RedisTierTest, BinaryKeysAndNamespaces) {
  EXPECT_EQ("hkv:2:nsk", RedisTierKey({"ns", "k"}));
  auto tier = OpenOrDie();
  ASSERT_NE(nullptr, tier);
  const std::string nul_ff("\0\xff", 2);
  const std::vector<TierKey> keys = {
      {nul_ff, std::string("\0", 1)},
      {nul_ff, std::string("\xff\0\0", 3)},
      {"", nul_ff},
      {"a", "bc"},  // must not meet ("ab", "c")
      {"ab", "c"},
      {std::string(300, '\xff'), std::string(64, '\0')},
  };
  std::vector<std::string> values;
  for (size_t i = 0; i < keys.size(); ++i)
    values.push_back(Page(100 + i, 4096));
  PutAll(*tier, keys, values);
  ExpectValues(*tier, keys, values);
  EXPECT_EQ(keys.size(), Count(*tier, keys));
  ASSERT_OK(tier->Delete({keys[3]}));
  EXPECT_ERROR(NotFound, GetOne(*tier, keys[3]));
  ExpectValues(*tier, {keys[4]}, {values[4]});
}

TEST_F(RedisTierTest, BatchesOfAThousand) {
  auto tier = OpenOrDie();
  ASSERT_NE(nullptr, tier);
  const std::vector<TierKey> keys = Keys("batch", 1000);
  std::vector<std::string> values;
  for (int i = 0; i < 1000; ++i) values.push_back(Page(i, 16 << 10));
  PutAll(*tier, keys, values);
  ExpectValues(*tier, keys, values);
  EXPECT_EQ(1000u, Count(*tier, keys));
  ASSERT_OK(tier->Delete({keys[500]}));
  EXPECT_EQ(500u, Count(*tier, keys));
  ASSERT_OK(tier->Delete(keys));
  EXPECT_EQ(0u, Count(*tier, keys));
}

TEST_F(RedisTierTest, TwoTiersOnOneServerSeeEachOthersValues) {
  auto first = OpenOrDie();
  auto second = OpenOrDie();
  ASSERT_NE(nullptr, first);
  ASSERT_NE(nullptr, second);
  const std::vector<TierKey> keys = Keys("shared", 3);
  const std::vector<std::string> pages = {Page(1, 1 << 20), Page(2, 1 << 20),
                                          Page(3, 1 << 20)};
  PutAll(*first, keys, pages);
  EXPECT_EQ(3u, Count(*second, keys));
  ExpectValues(*second, keys, pages);
  ASSERT_OK(second->Delete({keys[0]}));
  EXPECT_EQ(0u, Count(*first, keys));
}

TEST_F(RedisTierTest, WrongTypesAndErrorsAreStatuses) {
  auto tier = OpenOrDie();
  ASSERT_NE(nullptr, tier);
  const TierKey list_key = {"ns", "a list"};
  ASSERT_EQ(REDIS_REPLY_INTEGER,
            RawCommand({"RPUSH", RedisTierKey(list_key), "x"}));
  // WRONGTYPE: an error of that item, the others are served.
  const std::vector<TierKey> keys = {{"ns", "fine"}, list_key};
  PutAll(*tier, {keys[0]}, {"fine"});
  std::vector<absl::StatusOr<std::string>> got = tier->Get(keys);
  EXPECT_OK(got[0]);
  EXPECT_ERROR(Internal, got[1]);
  EXPECT_EQ(2u, Count(*tier, keys));  // EXISTS is true for any type
  // A full server: OOM on writes is ResourceExhausted.
  ASSERT_EQ(REDIS_REPLY_STATUS,
            RawCommand({"CONFIG", "SET", "maxmemory", "1"}));
  std::vector<absl::Status> put =
      tier->Put({{"ns", "big"}}, {Page(9, 1 << 20)});
  EXPECT_ERROR(ResourceExhausted, put[0]);
  ASSERT_EQ(REDIS_REPLY_STATUS,
            RawCommand({"CONFIG", "SET", "maxmemory", "0"}));
}

TEST_F(RedisTierTest, BadOptions) {
  EXPECT_ERROR(InvalidArgument,
               RedisTier::Open(
                   {"localhost", "", absl::Seconds(1), absl::Seconds(1), 4}));
  EXPECT_ERROR(InvalidArgument, RedisTier::Open({"unix:", "", absl::Seconds(1),
                                                 absl::Seconds(1), 4}));
  EXPECT_ERROR(InvalidArgument, Open(/*max_connections=*/0));
}

TEST_F(RedisTierTest, ServerDownAtOpenThenUp) {
  server_.Kill();
  auto tier = Open();
  ASSERT_OK(tier);  // not an error: the tier connects when it can
  EXPECT_ERROR(Unavailable, GetOne(**tier, Keys("ns", 2)[1]));
  ASSERT_OK(server_.Start());
  absl::Status status = absl::UnknownError("never tried");
  for (int i = 0; i < 500 && !status.ok(); ++i) {
    status = (*tier)->CountPrefix(Keys("ns", 2)).status();
    if (!status.ok()) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_OK(status);
}

// After a failed connection attempt the tier does not try again before the
// backoff has passed: the next calls fail at once, naming the last error.
TEST_F(RedisTierTest, BackoffAfterAFailedConnect) {
  server_.Kill();
  RedisTierOptions options{server_.address(), "", absl::Seconds(1),
                           absl::Seconds(1), 2};
  options.first_backoff = absl::Hours(1);  // no second attempt in this test
  auto tier = RedisTier::Open(options);    // its probe fails: backoff starts
  ASSERT_OK(tier);
  ASSERT_OK(server_.Start());
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<uint64_t> count = (*tier)->CountPrefix(Keys("ns", 1));
    EXPECT_ERROR(Unavailable, count);
    EXPECT_NE(std::string::npos,
              count.status().message().find("not connected (next attempt in"))
        << count.status();
  }
}

// Redis killed while the tier is in use: calls return Unavailable; Redis
// restarted on the same socket: the tier serves again by itself.
TEST_F(RedisTierTest, KilledAndRestarted) {
  auto tier = OpenOrDie(/*max_connections=*/2);
  ASSERT_NE(nullptr, tier);
  const std::vector<TierKey> keys = Keys("restart", 8);
  std::vector<std::string> pages;
  for (int i = 0; i < 8; ++i) pages.push_back(Page(i, 256 << 10));
  PutAll(*tier, keys, pages);
  ExpectValues(*tier, keys, pages);

  server_.Kill();
  for (int round = 0; round < 20; ++round) {
    for (const absl::StatusOr<std::string>& got : tier->Get(keys)) {
      EXPECT_ERROR(Unavailable, got);
    }
    for (const absl::Status& s : tier->Put(keys, Views(pages))) {
      EXPECT_ERROR(Unavailable, s);
    }
    EXPECT_ERROR(Unavailable, tier->CountPrefix(keys));
    EXPECT_ERROR(Unavailable, tier->Delete(keys));
  }

  ASSERT_OK(server_.Start());
  absl::StatusOr<uint64_t> count = absl::UnknownError("never tried");
  for (int i = 0; i < 500 && !count.ok(); ++i) {
    count = tier->CountPrefix(keys);
    if (!count.ok()) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_OK(count);
  EXPECT_EQ(0u, *count);  // no persistence: the restarted server is empty
  PutAll(*tier, keys, pages);
  ExpectValues(*tier, keys, pages);
  EXPECT_EQ(8u, Count(*tier, keys));
}

// A server that stops answering: calls end with DeadlineExceeded (they
// return; how fast is not checked); when it answers again, so does the tier.
TEST_F(RedisTierTest, SlowServerGivesDeadlineExceeded) {
  auto opened = RedisTier::Open(
      {server_.address(), "", absl::Seconds(1), absl::Milliseconds(200), 2});
  ASSERT_OK(opened);
  RedisTier& tier = **opened;
  const std::vector<TierKey> keys = Keys("slow", 2);
  PutAll(tier, keys, {"one", "two"});

  server_.Pause();
  std::vector<absl::StatusOr<std::string>> got = tier.Get(keys);
  EXPECT_ERROR(DeadlineExceeded, got[0]);
  EXPECT_ERROR(DeadlineExceeded, got[1]);
  // The next call opens a new connection (the kernel accepts it for the
  // stopped server) and times out on its reply.
  EXPECT_ERROR(DeadlineExceeded, tier.CountPrefix(keys));
  server_.Resume();

  absl::StatusOr<uint64_t> count = absl::UnknownError("never tried");
  for (int i = 0; i < 500 && !count.ok(); ++i) {
    count = tier.CountPrefix(keys);
    if (!count.ok()) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_OK(count);
  EXPECT_EQ(2u, *count);
  ExpectValues(tier, keys, {"one", "two"});
}

// Pooled connections the server closed (a restart while the tier was idle,
// CLIENT KILL as by Redis' idle timeout): the next call still succeeds.
TEST_F(RedisTierTest, StalePooledConnectionsAreReplaced) {
  auto tier = OpenOrDie(/*max_connections=*/2);
  ASSERT_NE(nullptr, tier);
  const std::vector<TierKey> keys = Keys("stale", 2);
  PutAll(*tier, keys, {"one", "two"});
  ASSERT_EQ(REDIS_REPLY_INTEGER,
            RawCommand({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"}));
  ExpectValues(*tier, keys, {"one", "two"});

  server_.Kill();
  ASSERT_OK(server_.Start());
  EXPECT_ERROR(NotFound, GetOne(*tier, keys[0]));  // a new, empty server
  PutAll(*tier, keys, {"three", "four"});
  ExpectValues(*tier, keys, {"three", "four"});
}

TEST_F(RedisTierTest, ConcurrentCallsFromThreads) {
  auto tier = OpenOrDie(/*max_connections=*/3);
  ASSERT_NE(nullptr, tier);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 25; ++round) {
        const std::vector<TierKey> keys =
            Keys(absl::StrCat("thread", t), 4, absl::StrCat(round, "-"));
        std::vector<std::string> values;
        for (int i = 0; i < 4; ++i) {
          values.push_back(Page(t * 1000 + round * 10 + i, 64 << 10));
        }
        for (const absl::Status& s : tier->Put(keys, Views(values))) {
          if (!s.ok()) ++failures;
        }
        std::vector<absl::StatusOr<std::string>> got = tier->Get(keys);
        for (size_t i = 0; i < keys.size(); ++i) {
          if (!got[i].ok() || *got[i] != values[i]) ++failures;
        }
        absl::StatusOr<uint64_t> count = tier->CountPrefix(keys);
        if (!count.ok() || *count != 4) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(0, failures.load());
}

class RedisTierAuthTest : public RedisTierTest {
 protected:
  std::string Password() const override { return "s3cret"; }
};

TEST_F(RedisTierAuthTest, RightPasswordWorks) {
  auto tier = OpenOrDie();
  ASSERT_NE(nullptr, tier);
  const std::vector<TierKey> keys = Keys("auth", 2);
  PutAll(*tier, keys, {Page(1, 4096), Page(2, 4096)});
  ExpectValues(*tier, keys, {Page(1, 4096), Page(2, 4096)});
}

TEST_F(RedisTierAuthTest, WrongPasswordFailsOpen) {
  auto tier = Open(4, "wrong");
  EXPECT_ERROR(Unauthenticated, tier);
  EXPECT_NE(std::string::npos, tier.status().message().find("AUTH refused"))
      << tier.status();
}

TEST_F(RedisTierAuthTest, NoPasswordGivesUnauthenticatedItems) {
  auto tier = Open(4, "");
  ASSERT_OK(tier);
  std::vector<absl::StatusOr<std::string>> got = (*tier)->Get(Keys("auth", 2));
  EXPECT_ERROR(Unauthenticated, got[0]);
  EXPECT_ERROR(Unauthenticated, got[1]);
  EXPECT_NE(std::string::npos, got[0].status().message().find("NOAUTH"))
      << got[0].status();
  EXPECT_ERROR(Unauthenticated, (*tier)->CountPrefix(Keys("auth", 2)));
}

}  // namespace
}  // namespace hostkv
