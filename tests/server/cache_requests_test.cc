// The page cache's requests over the real pools, allocator, sessions and
// copy engine (no gRPC): published pages outlive their session and load
// elsewhere byte for byte, cached pages refuse writes, eviction takes only
// unreferenced pages in LRU order, namespaces belong to their first
// publisher's uid, and the races of the issue (publish during a backup,
// release during a load, lookup against eviction, publish against free)
// leave every structure consistent.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/service/request_handler.h"
#include "tests/server/handler_fixture.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr uint32_t kAlice = 61001;
constexpr uint32_t kBob = 61002;
constexpr uint64_t kPages = 16;  // Spec("p"): 60 tokens -> 16 pages of 4

RequestLimits CacheLimits() {
  RequestLimits limits{1 << 16, Prefix()};
  limits.pool_access = v1::POOL_ACCESS_ANY;  // namespaces, not pools, decide
  limits.cache_publish_wait = absl::Seconds(20);
  return limits;
}

std::vector<std::string> Keys(int first, int count, const char* prefix = "k") {
  std::vector<std::string> keys;
  for (int i = first; i < first + count; ++i) keys.push_back(absl::StrCat(prefix, i));
  return keys;
}

std::vector<uint64_t> Flatten(
    const google::protobuf::RepeatedPtrField<v1::PageRun>& runs) {
  std::vector<uint64_t> pages;
  for (const v1::PageRun& run : runs) {
    for (uint64_t i = 0; i < run.num_pages(); ++i) pages.push_back(run.first_page() + i);
  }
  return pages;
}

class CacheRequestsTest : public HandlerFixture {
 protected:
  explicit CacheRequestsTest(RequestLimits limits = CacheLimits(),
                             CacheOptions cache = {})
      : HandlerFixture(std::move(limits), cache) {}

  void SetUp() override { CreatePool("p"); }

  HostPool& Pool() { return *pools_.Get("p").value(); }

  absl::StatusOr<v1::PublishResponse> Publish(
      const SessionId& s, const std::vector<std::string>& keys,
      const std::vector<uint64_t>& pages, bool acquire = false,
      const std::string& ns = "model-a", std::vector<std::string> parents = {}) {
    v1::PublishRequest request;
    request.set_session_id(s);
    request.set_pool("p");
    request.set_namespace_(ns);
    request.set_acquire(acquire);
    for (size_t i = 0; i < keys.size(); ++i) {
      v1::CacheItem* item = request.add_items();
      item->set_key(keys[i]);
      item->set_page(pages[i]);
      if (i < parents.size()) item->set_parent_key(parents[i]);
    }
    return handler_.Publish(request);
  }

  absl::StatusOr<v1::LookupResponse> Lookup(const SessionId& s,
                                            const std::vector<std::string>& keys,
                                            bool acquire = false,
                                            const std::string& ns = "model-a") {
    v1::LookupRequest request;
    request.set_session_id(s);
    request.set_pool("p");
    request.set_namespace_(ns);
    request.set_acquire(acquire);
    for (const std::string& key : keys) request.add_keys(key);
    return handler_.Lookup(request);
  }

  uint64_t Hits(const SessionId& s, const std::vector<std::string>& keys,
                const std::string& ns = "model-a") {
    auto r = Lookup(s, keys, false, ns);
    EXPECT_OK(r);
    return r.ok() ? r->hits() : 0;
  }

  absl::StatusOr<v1::ListEvictionsResponse> Evictions(
      const SessionId& s, uint64_t after, uint32_t max_keys = 100,
      const std::string& ns = "model-a") {
    v1::ListEvictionsRequest request;
    request.set_session_id(s);
    request.set_pool("p");
    request.set_namespace_(ns);
    request.set_after(after);
    request.set_max_keys(max_keys);
    return handler_.ListEvictions(request);
  }

  absl::StatusOr<v1::ReleaseResponse> Release(const SessionId& s,
                                              const std::vector<uint64_t>& pages) {
    v1::ReleaseRequest request;
    request.set_session_id(s);
    request.set_pool("p");
    for (uint64_t page : pages) {
      v1::PageRun* run = request.add_pages();
      run->set_first_page(page);
      run->set_num_pages(1);
    }
    return handler_.Release(request);
  }

  absl::StatusOr<v1::CopyPagesResponse> Copy(const SessionId& s,
                                             const std::vector<uint64_t>& from,
                                             const std::vector<uint64_t>& to) {
    v1::CopyPagesRequest request;
    request.set_session_id(s);
    request.set_pool("p");
    for (uint64_t page : from) {
      v1::PageRun* run = request.add_from_pages();
      run->set_first_page(page);
      run->set_num_pages(1);
    }
    for (uint64_t page : to) {
      v1::PageRun* run = request.add_to_pages();
      run->set_first_page(page);
      run->set_num_pages(1);
    }
    return handler_.CopyPages(request);
  }

  absl::StatusOr<std::string> Read(const SessionId& s, uint64_t page) {
    v1::ReadPagesRequest request;
    request.set_session_id(s);
    request.set_pool("p");
    v1::PageRun* run = request.add_pages();
    run->set_first_page(page);
    run->set_num_pages(1);
    auto r = handler_.ReadPages(request);
    if (!r.ok()) return r.status();
    return r->data();
  }

  absl::Status Write(const SessionId& s, uint64_t page, char byte) {
    v1::WritePagesRequest request;
    request.set_session_id(s);
    request.set_pool("p");
    v1::PageRun* run = request.add_pages();
    run->set_first_page(page);
    run->set_num_pages(1);
    request.set_data(std::string(Pool().geometry().page_bytes(), byte));
    return handler_.WritePages(request).status();
  }

  std::vector<uint64_t> AllocPages(const SessionId& s, uint64_t pages) {
    return Flatten(Alloc(s, pages * kPageSize).pages());
  }

  // Device rows [first_slot, +slots) of every layer, K and V, filled with
  // bytes derived from `seed`.
  void FillDevice(uint64_t first_slot, uint64_t slots, uint8_t seed) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t l = 0; l < kLayers; ++l) {
        for (uint64_t t = first_slot; t < first_slot + slots; ++t) {
          uint8_t* row = DeviceRow(kv, l, t);
          for (uint64_t i = 0; i < kStride; ++i) {
            row[i] = static_cast<uint8_t>(seed + 31 * kv + 17 * l + 7 * (t - first_slot) + i);
          }
        }
      }
    }
  }

  bool DeviceRowsEqual(uint64_t a, uint64_t b, uint64_t slots) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t l = 0; l < kLayers; ++l) {
        if (std::memcmp(DeviceRow(kv, l, a), DeviceRow(kv, l, b), slots * kStride) != 0) {
          return false;
        }
      }
    }
    return true;
  }

  // A transfer of host `pages` (one run each) to or from device slots from
  // `first_slot`; waits for it.
  absl::Status Copy(const SessionId& s, uint64_t import,
                    const std::vector<uint64_t>& pages, uint64_t first_slot,
                    bool load) {
    v1::TransferRequest request;
    request.set_session_id(s);
    request.set_pool("p");
    request.set_import_id(import);
    for (uint64_t page : pages) {
      v1::PageRun* run = request.add_host_pages();
      run->set_first_page(page);
      run->set_num_pages(1);
    }
    v1::SlotRun* d = request.add_device_slots();
    d->set_first_slot(first_slot);
    d->set_num_slots(pages.size() * kPageSize);
    auto r = load ? handler_.Load(request) : handler_.Backup(request);
    if (!r.ok()) return r.status();
    sessions_.Get(s).value()->signals()->AwaitIdle();
    return absl::OkStatus();
  }

  void Close(const SessionId& s) {
    v1::CloseSessionRequest close;
    close.set_session_id(s);
    ASSERT_OK(handler_.CloseSession(close));
  }

  // A session that wrote device slots [0, 16) to 4 pages and published
  // them as k0..k3 (parents chained); returns the pages.
  std::vector<uint64_t> PublishFour(const SessionId& s) {
    const uint64_t import = Register(s);
    const std::vector<uint64_t> pages = AllocPages(s, 4);
    FillDevice(0, 16, 11);
    EXPECT_OK(Copy(s, import, pages, 0, /*load=*/false));
    auto published = Publish(s, Keys(0, 4), pages, false, "model-a",
                             {"", "k0", "k1", "k2"});
    EXPECT_OK(published);
    if (published.ok()) EXPECT_EQ(4u, published->cached());
    return pages;
  }

  void ExpectConsistent() {
    EXPECT_OK(Pool().cache().CheckConsistency());
    const SlotAllocator::Occupancy o = Pool().allocator().Snapshot();
    uint64_t used = 0;
    for (const auto& [tag, pages] : o.usage) used += pages;
    EXPECT_EQ(kPages, o.free_pages + used + o.cached_pages);
    EXPECT_EQ(Pool().cache().cached_pages(),
              o.cached_pages - Pool().allocator().pages_freed_when_unpinned());
  }
};

// A chained Publish names no parents after the first item, yet evicts as
// explicit parents do: the chain's last page goes first, though it was
// used last. Published unchained, a page of the prefix goes first.
TEST_F(CacheRequestsTest, AChainedPublishTakesEachPreviousKeyAsParent) {
  for (const bool chained : {true, false}) {
    const SessionId s = OpenSession();
    const std::vector<uint64_t> pages = AllocPages(s, 4);
    v1::PublishRequest request;
    request.set_session_id(s);
    request.set_pool("p");
    request.set_namespace_("model-a");
    request.set_chained(chained);
    for (int i = 0; i < 4; ++i) {
      v1::CacheItem* item = request.add_items();
      item->set_key(absl::StrCat("k", i));
      item->set_page(pages[i]);
    }
    ASSERT_OK(handler_.Publish(request));
    EXPECT_EQ(1u, Hits(s, {"k3"}));  // k3 is now the most recently used
    // One page more than is free: one cached page is evicted.
    AllocPages(s, Pool().allocator().free_pages() + 1);
    if (chained) {
      EXPECT_EQ(3u, Hits(s, Keys(0, 4)));
    } else {
      EXPECT_LT(Hits(s, Keys(0, 4)), 3u);  // the control: k3 outlived a parent
    }
    Close(s);
    ExpectConsistent();
    // The next round starts from an empty cache.
    const SessionId drain = OpenSession();
    AllocPages(drain, kPages);
    Close(drain);
  }
}

TEST_F(CacheRequestsTest, AChainedPublishRefusesLaterParentKeys) {
  const SessionId s = OpenSession();
  const std::vector<uint64_t> pages = AllocPages(s, 2);
  v1::PublishRequest request;
  request.set_session_id(s);
  request.set_pool("p");
  request.set_namespace_("model-a");
  request.set_chained(true);
  for (int i = 0; i < 2; ++i) {
    v1::CacheItem* item = request.add_items();
    item->set_key(absl::StrCat("k", i));
    item->set_page(pages[i]);
    item->set_parent_key("x");  // the first may, the second may not
  }
  auto refused = handler_.Publish(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("item 1"), std::string::npos)
      << refused.status();
  EXPECT_EQ(0u, Pool().cache().cached_pages());  // nothing was published
}

TEST_F(CacheRequestsTest, PublishedPagesOutliveTheirSessionAndLoadElsewhere) {
  const SessionId writer = OpenSession();
  const std::vector<uint64_t> pages = PublishFour(writer);
  Close(writer);  // its end frees its own pages, not the cache's
  EXPECT_EQ(4u, Pool().cache().cached_pages());

  const SessionId reader = OpenSession();
  EXPECT_EQ(4u, Hits(reader, Keys(0, 4)));
  EXPECT_EQ(2u, Hits(reader, {"k0", "k1", "nope", "k3"}));
  auto found = Lookup(reader, Keys(0, 4), /*acquire=*/true);
  ASSERT_OK(found);
  EXPECT_EQ(pages, Flatten(found->pages()));
  const uint64_t import = Register(reader);
  ASSERT_OK(Copy(reader, import, pages, 32, /*load=*/true));
  EXPECT_TRUE(DeviceRowsEqual(0, 32, 16));

  v1::GetPoolStatsRequest stats_request;
  stats_request.set_pool("p");
  auto stats = handler_.GetPoolStats(stats_request);
  ASSERT_OK(stats);
  const v1::PoolStats& p = stats->pools(0);
  EXPECT_EQ(4u, p.cached_pages());
  EXPECT_EQ(4u, p.cache().cached_pages());
  EXPECT_EQ(4u, p.cache().referenced_pages());
  EXPECT_EQ(4u + 2u + 4u, p.cache().hits());
  EXPECT_EQ(2u, p.cache().misses());
  ASSERT_EQ(1, p.cache_namespaces_size());
  EXPECT_EQ("model-a", p.cache_namespaces(0).name());
  EXPECT_EQ(getuid(), p.cache_namespaces(0).owner_uid());
  uint64_t session_pages = 0;
  for (const v1::SessionUsage& u : p.sessions()) session_pages += u.pages();
  EXPECT_EQ(p.used_pages(), session_pages + p.cached_pages());
  ExpectConsistent();
}

TEST_F(CacheRequestsTest, CachedPagesRefuseWritesFreesAndUnreferencedReads) {
  const SessionId writer = OpenSession();
  const std::vector<uint64_t> pages = PublishFour(writer);
  const uint64_t import = Register(writer);
  EXPECT_ERROR(FailedPrecondition, Free(writer, pages[0], 1));
  EXPECT_ERROR(FailedPrecondition, Copy(writer, import, {pages[0]}, 0, false));
  EXPECT_ERROR(FailedPrecondition, Write(writer, pages[0], 'x'));
  // Its publisher holds no reference: no load, read or copy either.
  EXPECT_ERROR(FailedPrecondition, Copy(writer, import, {pages[0]}, 0, true));
  EXPECT_ERROR(FailedPrecondition, Read(writer, pages[0]));
  EXPECT_ERROR(FailedPrecondition, Release(writer, {pages[0]}));
  v1::HandOverPagesRequest hand;
  hand.set_session_id(writer);
  hand.set_pool("p");
  hand.add_pages()->set_first_page(pages[0]);
  hand.mutable_pages(0)->set_num_pages(1);
  const SessionId other = OpenSession();
  hand.set_to_session_number(numbers_[other]);
  EXPECT_ERROR(FailedPrecondition, handler_.HandOverPages(hand));
  // Publishing a cached page again: it is not the session's.
  EXPECT_ERROR(FailedPrecondition, Publish(writer, {"again"}, {pages[0]}));

  ASSERT_OK(Lookup(writer, {"k0"}, true));
  auto bytes = Read(writer, pages[0]);
  ASSERT_OK(bytes);
  EXPECT_EQ(Pool().geometry().page_bytes(), bytes->size());
  auto released = Release(writer, {pages[0]});
  ASSERT_OK(released);
  EXPECT_EQ(1u, released->released());
  EXPECT_ERROR(FailedPrecondition, Release(writer, {pages[0]}));
  EXPECT_EQ(4u, Pool().cache().cached_pages());
  ExpectConsistent();
}

TEST_F(CacheRequestsTest, AKeyCachedAlreadyKeepsTheFirstPage) {
  const SessionId a = OpenSession();
  const SessionId b = OpenSession();
  const std::vector<uint64_t> first = AllocPages(a, 1);
  const std::vector<uint64_t> second = AllocPages(b, 2);
  ASSERT_OK(Publish(a, {"k0"}, first));
  auto r = Publish(b, {"k0", "k1"}, second, /*acquire=*/true);
  ASSERT_OK(r);
  EXPECT_EQ(v1::PUBLISH_ALREADY_CACHED, r->results(0).outcome());
  EXPECT_EQ(first[0], r->results(0).page());
  EXPECT_EQ(v1::PUBLISH_CACHED, r->results(1).outcome());
  EXPECT_EQ(1u, r->cached());
  EXPECT_EQ(1u, r->already_cached());
  // b's first page stayed b's; b holds references on both cached pages.
  EXPECT_OK(Free(b, second[0], 1));
  EXPECT_EQ(1u, Pool().cache().References(first[0]));
  EXPECT_EQ(1u, Pool().cache().References(second[1]));
  // One page under two keys: the second item changes nothing.
  const std::vector<uint64_t> page = AllocPages(a, 1);
  auto twice = Publish(a, {"x", "y"}, {page[0], page[0]});
  ASSERT_OK(twice);
  EXPECT_EQ(v1::PUBLISH_CACHED, twice->results(0).outcome());
  EXPECT_EQ(v1::PUBLISH_CONFLICT, twice->results(1).outcome());
  EXPECT_EQ(1u, Hits(a, {"x"}));
  EXPECT_EQ(0u, Hits(a, {"y"}));
  ExpectConsistent();
}

// A Publish sent again (its first try's answer lost to a restart): the
// items the first try cached exactly as they say are answered CACHED and
// change nothing; the others are published now; acquire takes one
// reference per item either way.
TEST_F(CacheRequestsTest, APublishSentAgainIsAnsweredAsIfItRanOnce) {
  const SessionId s = OpenSession();
  const std::vector<uint64_t> pages = AllocPages(s, 3);
  ASSERT_OK(Publish(s, {"k0", "k1"}, {pages[0], pages[1]}));
  auto again = Publish(s, {"k0", "k1", "k2"}, pages, /*acquire=*/true);
  ASSERT_OK(again);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(v1::PUBLISH_CACHED, again->results(i).outcome()) << i;
    EXPECT_EQ(pages[i], again->results(i).page()) << i;
  }
  EXPECT_EQ(3u, again->cached());
  EXPECT_EQ(3u, Pool().cache().cached_pages());
  EXPECT_EQ(0u, Pool().allocator().pages_owned_by(numbers_[s]));
  for (uint64_t page : pages) EXPECT_EQ(1u, Pool().cache().References(page));
  // A key on another page than the item's is not the same Publish.
  EXPECT_ERROR(FailedPrecondition, Publish(s, {"k0"}, {pages[1]}));
  // A failure after the republished items took their references gives
  // them back: here the fresh item's page is not the session's.
  EXPECT_ERROR(FailedPrecondition,
               Publish(s, {"k0", "k9"}, {pages[0], pages[2] + 1}, /*acquire=*/true));
  EXPECT_EQ(1u, Pool().cache().References(pages[0]));
  ExpectConsistent();
}

TEST_F(CacheRequestsTest, BadPublishesChangeNothing) {
  const SessionId s = OpenSession();
  const std::vector<uint64_t> pages = AllocPages(s, 1);
  EXPECT_ERROR(InvalidArgument, Publish(s, {"k"}, pages, false, ""));
  EXPECT_ERROR(InvalidArgument, Publish(s, {"k"}, pages, false, std::string(129, 'n')));
  EXPECT_ERROR(InvalidArgument, Publish(s, {""}, pages));
  EXPECT_ERROR(InvalidArgument, Publish(s, {std::string(65, 'k')}, pages));
  EXPECT_ERROR(InvalidArgument,
               Publish(s, {"k"}, pages, false, "m", {std::string(65, 'p')}));
  EXPECT_ERROR(InvalidArgument, Publish(s, {}, {}));
  EXPECT_ERROR(InvalidArgument, Publish(s, {"k"}, {kPages}));  // out of range
  EXPECT_ERROR(FailedPrecondition, Publish(s, {"k"}, {pages[0] + 1}));  // not its
  EXPECT_ERROR(InvalidArgument, Lookup(s, {}));
  EXPECT_ERROR(InvalidArgument, Lookup(s, {std::string(65, 'k')}));
  EXPECT_EQ(0u, Pool().cache().cached_pages());
  EXPECT_OK(Free(s, pages[0], 1));  // still the session's
  ExpectConsistent();
}

TEST_F(CacheRequestsTest, AllocEvictsOnlyUnreferencedPagesColdestFirst) {
  const SessionId writer = OpenSession();
  const std::vector<uint64_t> pages = AllocPages(writer, kPages);
  for (uint64_t p : pages) ASSERT_OK(Write(writer, p, static_cast<char>('a' + p)));
  // One call: earlier keys end up hotter, so k15 is the coldest.
  ASSERT_OK(Publish(writer, Keys(0, kPages), pages));
  const SessionId holder = OpenSession();
  auto held = Lookup(holder, Keys(0, 4), /*acquire=*/true);
  ASSERT_OK(held);
  std::vector<std::string> before;
  for (uint64_t p : Flatten(held->pages())) before.push_back(Read(holder, p).value());

  const SessionId hungry = OpenSession();
  const std::vector<uint64_t> fresh = AllocPages(hungry, 8);  // evicts k15..k8
  ASSERT_EQ(8u, fresh.size());
  for (uint64_t p : fresh) ASSERT_OK(Write(hungry, p, 'Z'));
  EXPECT_EQ(8u, Hits(hungry, Keys(0, 8)));
  EXPECT_EQ(0u, Hits(hungry, {"k8"}));
  EXPECT_EQ(0u, Hits(hungry, {"k15"}));
  EXPECT_EQ(8u, Pool().cache().CountersOf("model-a").evictions);
  // 4 unreferenced cached pages are left: 5 more cannot be had, and the
  // refusal evicts nothing.
  v1::AllocRequest more;
  more.set_session_id(hungry);
  more.set_pool("p");
  more.set_num_tokens(5 * kPageSize);
  EXPECT_ERROR(ResourceExhausted, handler_.Alloc(more));
  EXPECT_EQ(8u, Hits(hungry, Keys(0, 8)));
  EXPECT_EQ(4u, AllocPages(hungry, 4).size());  // k7..k4 go
  EXPECT_EQ(4u, Hits(hungry, Keys(0, 8)));
  // Referenced pages kept their bytes through all of it.
  const std::vector<uint64_t> kept = Flatten(held->pages());
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(before[i], Read(holder, kept[i]).value());
  EXPECT_ERROR(ResourceExhausted, handler_.Alloc(more));
  ExpectConsistent();
}

TEST_F(CacheRequestsTest, EvictionsAreListedToTheNamespacesUsers) {
  const SessionId writer = OpenSession(true, kAlice);
  const std::vector<uint64_t> pages = AllocPages(writer, kPages);
  ASSERT_OK(Publish(writer, Keys(0, kPages), pages));
  // A reader that starts now: no keys, the current number.
  auto start = Evictions(writer, 0, 0);
  ASSERT_OK(start);
  EXPECT_EQ(0, start->keys_size());
  EXPECT_EQ(0u, start->next());
  AllocPages(writer, 3);  // evicts k15, k14, k13: the coldest
  auto evicted = Evictions(writer, start->next());
  ASSERT_OK(evicted);
  EXPECT_EQ((std::vector<std::string>{"k15", "k14", "k13"}),
            std::vector<std::string>(evicted->keys().begin(), evicted->keys().end()));
  EXPECT_EQ(3u, evicted->next());
  EXPECT_EQ(0u, evicted->missed());
  // From the answer's next on: nothing new.
  auto again = Evictions(writer, evicted->next());
  ASSERT_OK(again);
  EXPECT_EQ(0, again->keys_size());
  // Another uid may not read the namespace; bad requests are refused.
  const SessionId other = OpenSession(true, kBob);
  EXPECT_ERROR(PermissionDenied, Evictions(other, 0));
  EXPECT_ERROR(InvalidArgument, Evictions(writer, 0, 65537));
  EXPECT_ERROR(InvalidArgument, Evictions(writer, 0, 10, ""));
  EXPECT_ERROR(NotFound, Evictions(SessionId(16, 'x'), 0));
  // A namespace nobody published in has none.
  auto none = Evictions(other, 0, 100, "model-z");
  ASSERT_OK(none);
  EXPECT_EQ(0, none->keys_size());
  EXPECT_EQ(3u, none->next());
  ExpectConsistent();
}

TEST_F(CacheRequestsTest, ParentsAreEvictedAfterTheirChildren) {
  const SessionId s = OpenSession();
  const std::vector<uint64_t> pages = AllocPages(s, 4);
  // Published root first in separate calls: the root is the coldest by
  // time, but it has children, so the leaf goes first.
  ASSERT_OK(Publish(s, {"k0"}, {pages[0]}));
  ASSERT_OK(Publish(s, {"k1"}, {pages[1]}, false, "model-a", {"k0"}));
  ASSERT_OK(Publish(s, {"k2"}, {pages[2]}, false, "model-a", {"k1"}));
  ASSERT_OK(Publish(s, {"k3"}, {pages[3]}, false, "model-a", {"k2"}));
  const SessionId other = OpenSession();
  AllocPages(other, kPages - 4);
  AllocPages(other, 1);
  EXPECT_EQ(3u, Hits(other, Keys(0, 4)));
  AllocPages(other, 2);
  EXPECT_EQ(1u, Hits(other, Keys(0, 4)));
  ExpectConsistent();
}

TEST_F(CacheRequestsTest, SharedPagesSurviveEitherSessionEnding) {
  const SessionId writer = OpenSession();
  const std::vector<uint64_t> pages = PublishFour(writer);
  Close(writer);
  const SessionId a = OpenSession();
  const SessionId b = OpenSession();
  ASSERT_OK(Lookup(a, Keys(0, 4), true));
  ASSERT_OK(Lookup(b, Keys(0, 4), true));
  EXPECT_EQ(2u, Pool().cache().References(pages[0]));
  const uint64_t ia = Register(a);
  const uint64_t ib = Register(b);
  // Both loads in flight at once, reading the same pages.
  std::thread ta([&] { EXPECT_OK(Copy(a, ia, pages, 16, true)); });
  std::thread tb([&] { EXPECT_OK(Copy(b, ib, pages, 32, true)); });
  ta.join();
  tb.join();
  EXPECT_TRUE(DeviceRowsEqual(0, 16, 16));
  EXPECT_TRUE(DeviceRowsEqual(0, 32, 16));
  Close(a);
  EXPECT_EQ(1u, Pool().cache().References(pages[0]));
  std::memset(DeviceRow(0, 0, 48), 0, kStride);
  ASSERT_OK(Copy(b, ib, pages, 48, true));
  EXPECT_TRUE(DeviceRowsEqual(0, 48, 16));
  Close(b);  // its end drops its references, never the pages
  EXPECT_EQ(0u, Pool().cache().referenced_pages());
  EXPECT_EQ(4u, Pool().cache().cached_pages());
  ExpectConsistent();
}

TEST_F(CacheRequestsTest, PublishWaitsForTheCopyFillingItsPages) {
  const SessionId s = OpenSession();
  const std::vector<uint64_t> pages = AllocPages(s, 1);
  // A copy in flight on the page, as a backup's would be.
  auto pinned = PinnedPages::Pin(pools_.Get("p").value(), {{pages[0], 1}},
                                 sessions_.Get(s).value()->tag());
  ASSERT_OK(pinned);
  std::atomic<bool> done{false};
  std::thread publisher([&] {
    EXPECT_OK(Publish(s, {"k0"}, pages));
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(done.load());  // still waiting: the copy is not finished
  EXPECT_FALSE(Pool().cache().IsCached(pages[0]));
  pinned->Release();
  publisher.join();
  EXPECT_TRUE(Pool().cache().IsCached(pages[0]));
  ExpectConsistent();
}

TEST_F(CacheRequestsTest, PublishRightAfterABackupCachesTheBackupsBytes) {
  const SessionId writer = OpenSession();
  const uint64_t import = Register(writer);
  const std::vector<uint64_t> pages = AllocPages(writer, 8);
  FillDevice(0, 32, 5);
  v1::TransferRequest backup = Transfer(writer, import, pages[0], 8, 0, 32);
  ASSERT_OK(handler_.Backup(backup));
  // No wait for the backup: the publish waits for it.
  ASSERT_OK(Publish(writer, Keys(0, 8), pages));
  const SessionId reader = OpenSession();
  ASSERT_OK(Lookup(reader, Keys(0, 8), true));
  const uint64_t ri = Register(reader);
  ASSERT_OK(Copy(reader, ri, pages, 32, true));
  EXPECT_TRUE(DeviceRowsEqual(0, 32, 32));
  ExpectConsistent();
}

TEST_F(CacheRequestsTest, AReleaseDuringALoadLetsTheLoadFinishFirst) {
  const SessionId writer = OpenSession();
  const std::vector<uint64_t> pages = PublishFour(writer);
  Close(writer);
  const SessionId reader = OpenSession();
  ASSERT_OK(Lookup(reader, Keys(0, 4), true));
  const uint64_t import = Register(reader);
  v1::TransferRequest load = Transfer(reader, import, pages[0], 4, 32, 16);
  ASSERT_OK(handler_.Load(load));
  ASSERT_OK(Release(reader, pages));
  // The released pages are evicted at once, while the load may still read
  // them: they are freed only when it is done.
  const SessionId hungry = OpenSession();
  v1::AllocRequest all;
  all.set_session_id(hungry);
  all.set_pool("p");
  all.set_num_tokens(kPages * kPageSize);
  auto got = handler_.Alloc(all);  // may fail while the load still reads
  sessions_.Get(reader).value()->signals()->AwaitIdle();
  EXPECT_TRUE(DeviceRowsEqual(0, 32, 16));
  EXPECT_EQ(0u, Pool().cache().cached_pages());
  if (!got.ok()) {
    EXPECT_ERROR(ResourceExhausted, got);
    EXPECT_EQ(kPages, AllocPages(hungry, kPages).size());
  }
  ExpectConsistent();
}

TEST_F(CacheRequestsTest, CopyPagesCopiesCachedPagesIntoTheSessionsOwn) {
  const SessionId writer = OpenSession();
  const std::vector<uint64_t> cached = PublishFour(writer);
  const SessionId s = OpenSession();
  ASSERT_OK(Lookup(s, Keys(0, 4), true));
  const std::vector<uint64_t> own = AllocPages(s, 4);
  auto copied = Copy(s, cached, own);
  ASSERT_OK(copied);
  EXPECT_EQ(4u, copied->pages());
  EXPECT_EQ(4 * Pool().geometry().page_bytes(), copied->bytes());
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(Read(s, cached[i]).value(), Read(s, own[i]).value());
  }
  // Own pages copy too (a page of its own into another).
  ASSERT_OK(Write(s, own[0], 'q'));
  ASSERT_OK(Copy(s, {own[0]}, {own[1]}));
  EXPECT_EQ(Read(s, own[0]).value(), Read(s, own[1]).value());
  EXPECT_ERROR(InvalidArgument, Copy(s, {cached[0], cached[1]}, {own[2]}));
  EXPECT_ERROR(FailedPrecondition, Copy(s, {own[0]}, {cached[0]}));  // cached target
  EXPECT_ERROR(InvalidArgument, Copy(s, {own[0]}, {own[0]}));        // overlap
  ASSERT_OK(Release(s, {cached[3]}));
  EXPECT_ERROR(FailedPrecondition, Copy(s, {cached[3]}, {own[3]}));  // not held
  ExpectConsistent();
}

TEST_F(CacheRequestsTest, APoolWithOnlyUnreferencedCachedPagesCanBeDeleted) {
  const SessionId writer = OpenSession();
  PublishFour(writer);
  Close(writer);
  const SessionId reader = OpenSession();
  ASSERT_OK(Lookup(reader, Keys(0, 1), true));
  v1::DeletePoolRequest del;
  del.set_session_id(reader);
  del.set_pool("p");
  EXPECT_ERROR(FailedPrecondition, handler_.DeletePool(del));  // referenced
  Close(reader);
  const SessionId admin = OpenSession();
  del.set_session_id(admin);
  EXPECT_OK(handler_.DeletePool(del));
}

// Peers of two users.

TEST_F(CacheRequestsTest, ANamespaceBelongsToItsFirstPublishersUid) {
  const SessionId mine = OpenSession(true, kAlice);
  const SessionId theirs = OpenSession(true, kBob);
  const SessionId unverified = OpenSession(/*attach=*/false);
  ASSERT_OK(Publish(mine, {"k0"}, AllocPages(mine, 1)));
  const std::vector<uint64_t> their_pages = AllocPages(theirs, 2);
  EXPECT_ERROR(PermissionDenied, Lookup(theirs, {"k0"}));
  EXPECT_ERROR(PermissionDenied, Lookup(theirs, {"k0"}, true));
  EXPECT_ERROR(PermissionDenied, Publish(theirs, {"k1"}, {their_pages[0]}));
  EXPECT_ERROR(PermissionDenied, Lookup(unverified, {"k0"}));
  // Their own namespace is theirs, and closed to this uid in turn.
  ASSERT_OK(Publish(theirs, {"k0"}, {their_pages[1]}, false, "model-b"));
  EXPECT_ERROR(PermissionDenied, Lookup(mine, {"k0"}, false, "model-b"));
  // Refused publishes moved nothing.
  EXPECT_OK(Free(theirs, their_pages[0], 1));
  // Root is no exception: another user's namespace could serve it bytes
  // that user chose.
  const SessionId root = OpenSession(true, 0);
  EXPECT_ERROR(PermissionDenied, Lookup(root, {"k0"}, false, "model-b"));
  EXPECT_ERROR(PermissionDenied, Lookup(root, {"k0"}, false, "model-a"));
  // A namespace nobody published in is empty to everyone, and not claimed.
  EXPECT_EQ(0u, Hits(theirs, {"k0"}, "model-c"));
  EXPECT_FALSE(Pool().namespaces().OwnerOf("model-c").has_value());
  ExpectConsistent();
}

class SharedCacheTest : public CacheRequestsTest {
 protected:
  static CacheOptions Shared() {
    CacheOptions options;
    options.sharing.kind = CacheSharing::Kind::kGroup;
    options.sharing.gid = kBob;  // OpenSession gives kBob's peer gid kBob
    options.max_namespaces_per_uid = 2;
    return options;
  }
  SharedCacheTest() : CacheRequestsTest(CacheLimits(), Shared()) {}
};

TEST_F(SharedCacheTest, AGroupSharesNamespacesAndEachUidClaimsFew) {
  const SessionId mine = OpenSession(true, kAlice);
  const SessionId member = OpenSession(true, kBob);
  const SessionId outsider = OpenSession(true, kBob + 1);
  ASSERT_OK(Publish(mine, {"k0"}, AllocPages(mine, 1)));
  EXPECT_EQ(1u, Hits(member, {"k0"}));
  EXPECT_ERROR(PermissionDenied, Lookup(outsider, {"k0"}));
  ASSERT_OK(Publish(mine, {"k0"}, AllocPages(mine, 1), false, "two"));
  EXPECT_ERROR(ResourceExhausted,
               Publish(mine, {"k0"}, AllocPages(mine, 1), false, "three"));
}

class LimitedCacheTest : public CacheRequestsTest {
 protected:
  static RequestLimits Limited() {
    RequestLimits limits = CacheLimits();
    limits.max_cache_refs_per_session = 3;
    limits.max_cache_refs_per_uid = 5;
    limits.cache_publish_wait = absl::Milliseconds(50);
    return limits;
  }
  LimitedCacheTest() : CacheRequestsTest(Limited()) {}
};

TEST_F(LimitedCacheTest, ReferencesAndPublishWaitsAreBounded) {
  const SessionId writer = OpenSession();
  PublishFour(writer);
  const SessionId s = OpenSession();
  EXPECT_ERROR(ResourceExhausted, Lookup(s, Keys(0, 4), true));
  ASSERT_OK(Lookup(s, Keys(0, 3), true));
  EXPECT_ERROR(ResourceExhausted, Lookup(s, {"k3"}, true));
  EXPECT_EQ(3u, Pool().cache().ReferencesHeldBy(sessions_.Get(s).value()->tag()));
  // A copy that does not finish within --cache_publish_wait: nothing moves.
  const std::vector<uint64_t> pages = AllocPages(s, 1);
  auto pinned = PinnedPages::Pin(pools_.Get("p").value(), {{pages[0], 1}},
                                 sessions_.Get(s).value()->tag());
  ASSERT_OK(pinned);
  EXPECT_ERROR(DeadlineExceeded, Publish(s, {"late"}, pages));
  pinned->Release();
  EXPECT_OK(Free(s, pages[0], 1));
  ExpectConsistent();
}

// More sessions buy no more references: the uid's sessions share one cap.
TEST_F(LimitedCacheTest, ReferencesAreCappedPerUid) {
  const SessionId writer = OpenSession();
  PublishFour(writer);
  const SessionId a = OpenSession();
  const SessionId b = OpenSession();
  ASSERT_OK(Lookup(a, Keys(0, 3), true));
  ASSERT_OK(Lookup(b, Keys(0, 2), true));
  auto refused = Lookup(b, {"k2"}, true);
  EXPECT_ERROR(ResourceExhausted, refused);
  EXPECT_NE(refused.status().message().find("--max_cache_refs_per_uid"),
            absl::string_view::npos)
      << refused.status();
  EXPECT_EQ(2u, Pool().cache().ReferencesHeldBy(sessions_.Get(b).value()->tag()));
  // Released references make room again.
  auto k0 = Lookup(a, {"k0"});
  ASSERT_OK(k0);
  ASSERT_OK(Release(a, Flatten(k0->pages())));
  EXPECT_OK(Lookup(b, {"k2"}, true));
  ExpectConsistent();
}

// References on cached pages are charged to the memory budget.
TEST_F(CacheRequestsTest, ReferencesAreChargedToTheMemoryBudget) {
  const SessionId writer = OpenSession();
  PublishFour(writer);
  const uint64_t before = budget_.reserved_bytes();
  const SessionId s = OpenSession();
  ASSERT_OK(Lookup(s, Keys(0, 4), true));
  EXPECT_EQ(budget_.reserved_bytes() - before,
            PageCache::kChargeStep * PageCache::kReferenceBytes);
  ExpectConsistent();
}

// One Lookup or Publish carries at most kMaxCacheKeysPerRequest keys (an
// engine splits a longer prefix); the bound keeps requests small.
TEST_F(CacheRequestsTest, KeysPerRequestAreBounded) {
  const SessionId s = OpenSession();
  std::vector<std::string> keys;
  for (int i = 0; i < kMaxCacheKeysPerRequest; ++i) keys.push_back(absl::StrCat("k", i));
  auto all = Lookup(s, keys);
  ASSERT_OK(all);
  EXPECT_EQ(all->hits(), 0u);
  keys.push_back("one-more");
  auto refused = Lookup(s, keys);
  EXPECT_ERROR(InvalidArgument, refused);
  EXPECT_NE(refused.status().message().find("65536"), absl::string_view::npos)
      << refused.status();
}

TEST_F(CacheRequestsTest, RacesLeaveEveryStructureConsistent) {
  // Publishers publish and free, lookers acquire, load-free-release, and an
  // allocator forces eviction, all at once.
  std::atomic<bool> stop{false};
  std::atomic<int> published{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      const SessionId s = OpenSession();
      for (int i = 0; i < 200 && !stop; ++i) {
        v1::AllocRequest a;
        a.set_session_id(s);
        a.set_pool("p");
        a.set_num_tokens(2 * kPageSize);
        auto got = handler_.Alloc(a);
        if (!got.ok()) continue;
        const std::vector<uint64_t> pages = Flatten(got->pages());
        // Publish one page and free the other at the same time as a
        // concurrent free of the published one (refused or too late).
        std::thread freer([&] { Free(s, pages[0], 1).IgnoreError(); });
        auto r = Publish(s, {absl::StrCat("w", w, "-", i)}, {pages[0]});
        freer.join();
        if (r.ok()) ++published;
        Free(s, pages[1], 1).IgnoreError();
      }
      Close(s);
    });
  }
  threads.emplace_back([&] {
    const SessionId s = OpenSession();
    for (int i = 0; i < 400 && !stop; ++i) {
      auto r = Lookup(s, {absl::StrCat("w0-", i % 200), absl::StrCat("w1-", i % 200)},
                      true);
      if (r.ok() && r->hits() > 0) {
        EXPECT_OK(Release(s, Flatten(r->pages())));
      }
    }
    Close(s);
  });
  threads.emplace_back([&] {
    const SessionId s = OpenSession();
    for (int i = 0; i < 300 && !stop; ++i) {
      v1::AllocRequest a;
      a.set_session_id(s);
      a.set_pool("p");
      a.set_num_tokens(6 * kPageSize);
      auto got = handler_.Alloc(a);
      if (got.ok()) {
        for (uint64_t p : Flatten(got->pages())) EXPECT_OK(Free(s, p, 1));
      }
    }
    Close(s);
  });
  for (std::thread& t : threads) t.join();
  EXPECT_GT(published.load(), 0);
  ExpectConsistent();
}

}  // namespace
}  // namespace hostkv
