// `hostkv stats` and `hostkv lookup` output: the page cache's counters and
// namespaces are shown, and a pool without cache stats prints exactly as it
// did before the cache.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "stats_table.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

v1::GetPoolStatsResponse Stats(const std::string& text) {
  v1::GetPoolStatsResponse stats;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &stats));
  return stats;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

constexpr char kPool[] = R"pb(
  pools {
    name: "llama"
    layout: LAYOUT_PAGE_FIRST
    page_size: 16
    used_pages: 12
    free_pages: 88
    capacity_pages: 100
    capacity_bytes: 1048576
    loads: 3
    backups: 4
    sessions { session_number: 7 client_name: "engine" pages: 2 bytes: 2048 }
  }
  open_sessions: 1)pb";

TEST(CliFormatTest, PoolWithoutCacheStatsPrintsAsBefore) {
  const std::vector<std::string> lines = Lines(FormatPoolStats(Stats(kPool)));
  ASSERT_EQ(4u, lines.size());
  EXPECT_EQ(
      "POOL             LAYOUT              PAGE   USED PAGES   FREE PAGES   "
      "USED%     CAPACITY    LOADS  BACKUPS",
      lines[0]);
  EXPECT_EQ(
      "llama            page_first            16           12           88   "
      "12.0%     1.00 MiB        3        4",
      lines[1]);
  EXPECT_EQ(
      "    session 7    engine               2 pages (2.00 KiB), 0 imports",
      lines[2]);
  EXPECT_EQ("sessions open: 1   memory reserved: 0 B", lines[3]);
}

TEST(CliFormatTest, PoolShowsCacheCountersAndNamespaces) {
  v1::GetPoolStatsResponse stats = Stats(std::string(kPool));
  v1::PoolStats* p = stats.mutable_pools(0);
  p->set_cached_pages(10);
  p->set_cache_reserved_bytes(3 << 20);
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(cached_pages: 10
           referenced_pages: 4
           evictable_pages: 5
           hits: 40
           misses: 2
           evictions: 6
           already_cached: 1
           conflicts: 3)pb",
      p->mutable_cache()));
  v1::CacheNamespaceStats* ns = p->add_cache_namespaces();
  ns->set_name("llama-8b/tp0");
  ns->set_owner_uid(1000);
  *ns->mutable_counters() = p->cache();
  v1::CacheNamespaceStats* other = p->add_cache_namespaces();
  other->set_name(std::string("\x01\xff", 2));
  other->set_owner_unverified(true);
  other->mutable_counters()->set_hits(9);
  const std::vector<std::string> lines = Lines(FormatPoolStats(stats));
  ASSERT_EQ(8u, lines.size());
  EXPECT_EQ(
      "    cache: 10 cached, 4 referenced, 5 evictable pages; 40 hits, 2 "
      "misses, 6 evictions, 1 already cached, 3 conflicts; metadata 3.00 MiB "
      "reserved",
      lines[2]);
  EXPECT_EQ(std::vector<std::string>({"NAMESPACE", "OWNER", "CACHED", "REFD",
                                      "EVICTABLE", "HITS", "MISSES",
                                      "EVICTIONS", "ALREADY", "CONFLICTS"}),
            std::vector<std::string>(
                absl::StrSplit(lines[3], ' ', absl::SkipEmpty())));
  EXPECT_EQ(std::vector<std::string>({"llama-8b/tp0", "uid", "1000", "10", "4",
                                      "5", "40", "2", "6", "1", "3"}),
            std::vector<std::string>(
                absl::StrSplit(lines[4], ' ', absl::SkipEmpty())));
  EXPECT_EQ(std::vector<std::string>({"\\x01\\xff", "unverified", "0", "0", "0",
                                      "9", "0", "0", "0", "0"}),
            std::vector<std::string>(
                absl::StrSplit(lines[5], ' ', absl::SkipEmpty())));
  // The session line and the totals follow, unchanged.
  EXPECT_EQ(
      "    session 7    engine               2 pages (2.00 KiB), 0 imports",
      lines[6]);
}

// Where a column starts in a line (its header's position), for a header
// word; names longer than the default width push every column right.
size_t ColumnOf(const std::string& line, const std::string& word) {
  return line.find(word);
}

TEST(CliFormatTest, LongNamesKeepTheColumnsAligned) {
  v1::GetPoolStatsResponse stats = Stats(std::string(kPool));
  v1::PoolStats* p = stats.mutable_pools(0);
  p->set_name("warm-restart-demo-with-a-long-name");
  const std::string long_ns = "sglang/demo-org/demo-model/tp0-1/p16/sha256";
  v1::CacheNamespaceStats* ns = p->add_cache_namespaces();
  ns->set_name(long_ns);
  ns->set_owner_uid(0);
  ns->mutable_counters()->set_cached_pages(8);
  p->mutable_cache()->set_cached_pages(8);
  const std::vector<std::string> lines = Lines(FormatPoolStats(stats));
  ASSERT_GE(lines.size(), 5u);
  // The pool row: the name, a space, then LAYOUT's column.
  EXPECT_EQ(lines[1].find("page_first"), ColumnOf(lines[0], "LAYOUT"));
  EXPECT_EQ(lines[1].rfind(p->name() + " ", 0), 0u);
  // The namespace row: OWNER's column starts after the whole name.
  EXPECT_EQ(lines[4].find("uid 0"), ColumnOf(lines[3], "OWNER"));
  EXPECT_EQ(lines[4].find(long_ns + " "), 4u);

  v1::Pool pool;
  pool.mutable_spec()->set_name(std::string(40, 'p'));
  pool.mutable_spec()->set_layout(v1::LAYOUT_PAGE_FIRST);
  const std::vector<std::string> pools = Lines(FormatPools({pool}));
  ASSERT_EQ(pools.size(), 2u);
  EXPECT_EQ(pools[1].find("MHA"), ColumnOf(pools[0], "ATTN"));
}

TEST(CliFormatTest, CountersWithoutNamespacesPrintNoTable) {
  v1::GetPoolStatsResponse stats = Stats(std::string(kPool));
  stats.mutable_pools(0)->mutable_cache()->set_misses(5);
  const std::vector<std::string> lines = Lines(FormatPoolStats(stats));
  ASSERT_EQ(5u, lines.size());
  EXPECT_EQ(
      "    cache: 0 cached, 0 referenced, 0 evictable pages; 0 hits, 5 "
      "misses, 0 evictions, 0 already cached, 0 conflicts",
      lines[2]);
}

TEST(CliFormatTest, TheTierLineComesBeforeTheTotals) {
  v1::GetPoolStatsResponse stats = Stats(std::string(kPool));
  v1::TierStats* t = stats.mutable_tier();
  t->set_url("redis://10.0.0.5:6379");
  t->set_serving(false);
  t->set_last_error("connect: Connection refused");
  t->set_written(12);
  t->set_written_bytes(3 << 20);
  t->set_write_failures(1);
  t->set_writes_dropped(2);
  t->set_writes_skipped(3);
  t->set_already_stored(9);
  t->set_write_queue_pages(4);
  t->set_write_queue_bytes(1 << 20);
  t->set_put_calls(5);
  t->set_put_mean_seconds(0.0015);
  t->set_read_hits(7);
  t->set_read_bytes(7 << 10);
  t->set_read_misses(8);
  t->set_read_corrupt(1);
  t->set_read_failures(2);
  t->set_fetch_no_space(3);
  t->set_fetches_late(4);
  t->set_get_calls(6);
  t->set_get_mean_seconds(0.00025);
  const std::vector<std::string> lines = Lines(FormatPoolStats(stats));
  ASSERT_GE(lines.size(), 4u);
  const size_t n = lines.size();
  EXPECT_EQ("tier: redis://10.0.0.5:6379 NOT SERVING (connect: Connection "
            "refused)",
            lines[n - 4]);
  EXPECT_EQ("    writes: 12 pages written (3.00 MiB), 9 already stored, 1 "
            "failed, 2 dropped, 3 evicted first; 4 queued (1.00 MiB); 5 calls, "
            "mean 1.50 ms",
            lines[n - 3]);
  EXPECT_EQ("    reads: 7 hits (7.00 KiB), 8 misses, 1 corrupt, 2 failed, 3 "
            "no space, 4 late; 6 calls, mean 0.25 ms",
            lines[n - 2]);
  EXPECT_TRUE(absl::StartsWith(lines[n - 1], "sessions open:")) << lines[n - 1];
}

TEST(CliFormatTest, HexKeys) {
  absl::StatusOr<std::string> key = ParseHexKey("00aBff");
  ASSERT_OK(key);
  EXPECT_EQ(std::string("\x00\xab\xff", 3), *key);
  EXPECT_ERROR(InvalidArgument, ParseHexKey(""));
  EXPECT_ERROR(InvalidArgument, ParseHexKey("abc"));
  EXPECT_ERROR(InvalidArgument, ParseHexKey("zz"));
  EXPECT_OK(ParseHexKey(std::string(128, 'a')));
  EXPECT_ERROR(InvalidArgument, ParseHexKey(std::string(130, 'a')));
}

TEST(CliFormatTest, LookupPrintsHitsThenAPagePerHitAndMisses) {
  LookupResult result;
  result.hits = 3;
  result.pages = {{10, 2}, {40, 1}};
  EXPECT_EQ(
      "hits: 3 of 4 keys\n  aa page 10\n  bb page 11\n  cc page 40\n  dd "
      "miss\n",
      FormatLookup({"aa", "bb", "cc", "dd"}, result));
  EXPECT_EQ("hits: 0 of 1 keys\n  aa miss\n",
            FormatLookup({"aa"}, LookupResult()));
}

}  // namespace
}  // namespace hostkv
