// The page cache through the client library and the real daemon: a warm
// restart across sessions (bytes compared), already-cached keys and
// conflicts, CopyPages, and the error codes each call gives back.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hostkv/client.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr char kPool[] = "cache";
constexpr char kNs[] = "test/model-a/tp0";

std::string Key(int i) { return absl::StrCat("key-", i); }

class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.started()) << daemon_.log();
    a_ = Connect("writer");
    v1::PoolSpec spec;
    spec.set_name(kPool);
    spec.set_page_size(4);
    spec.set_capacity_tokens(32 * 4);
    spec.set_layout(v1::LAYOUT_PAGE_FIRST);
    spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
    spec.mutable_geometry()->mutable_mha()->set_num_layers(2);
    spec.mutable_geometry()->mutable_mha()->set_num_kv_heads(1);
    spec.mutable_geometry()->mutable_mha()->set_head_dim(8);
    auto pool = a_->CreatePool(spec);
    ASSERT_OK(pool);
    page_bytes_ = pool->page_bytes();
  }

  std::unique_ptr<Client> Connect(const std::string& name) {
    auto client = Client::Connect(daemon_.target(), name);
    EXPECT_OK(client);
    return client.ok() ? std::move(*client) : nullptr;
  }

  // n pages of `client`'s, written with bytes that depend on `seed` and the
  // position: returns the pages and the bytes.
  std::vector<PageRange> WrittenPages(Client& client, uint64_t n, int seed,
                                      std::string* data) {
    auto pages = client.Alloc(kPool, n * 4);
    EXPECT_OK(pages);
    if (!pages.ok()) return {};
    data->resize(n * page_bytes_);
    for (size_t i = 0; i < data->size(); ++i) {
      (*data)[i] = static_cast<char>(seed * 31 + i * 7 + i / 251);
    }
    EXPECT_OK(client.WritePages(kPool, *pages, *data));
    return *pages;
  }

  // A chain of items over `pages`, keys Key(first_key + i).
  static std::vector<CacheItem> Chain(const std::vector<PageRange>& pages,
                                      int first_key = 0) {
    std::vector<CacheItem> items;
    int i = first_key;
    for (const PageRange& run : pages) {
      for (uint64_t p = 0; p < run.num_pages; ++p, ++i) {
        items.push_back(
            {Key(i), i == first_key ? "" : Key(i - 1), run.first_page + p});
      }
    }
    return items;
  }

  static std::vector<std::string> Keys(int n, int first = 0) {
    std::vector<std::string> keys;
    for (int i = first; i < first + n; ++i) keys.push_back(Key(i));
    return keys;
  }

  testing::DaemonProcess daemon_;
  std::unique_ptr<Client> a_;
  uint64_t page_bytes_ = 0;
};

TEST_F(CacheTest, WarmRestartFindsWhatAnEndedSessionPublished) {
  std::string data;
  const std::vector<PageRange> pages = WrittenPages(*a_, 4, 1, &data);
  const std::vector<CacheItem> items = Chain(pages);
  auto published = a_->Publish(kPool, kNs, items);
  ASSERT_OK(published);
  EXPECT_EQ(4u, published->cached);
  EXPECT_EQ(0u, published->already_cached);
  ASSERT_EQ(4u, published->items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(v1::PUBLISH_CACHED, published->items[i].outcome);
    EXPECT_EQ(items[i].page, published->items[i].page);
  }
  EXPECT_TRUE(PagesNotCached(items, *published).empty());
  ASSERT_OK(a_->Close());

  std::unique_ptr<Client> b = Connect("restarted");
  std::vector<std::string> keys = Keys(4);
  keys.push_back("never-published");
  auto found = b->Lookup(kPool, kNs, keys, /*acquire=*/true);
  ASSERT_OK(found);
  EXPECT_EQ(4u, found->hits);
  EXPECT_EQ(CountTokens(pages, 1), CountTokens(found->pages, 1));
  auto read = b->ReadPages(kPool, found->pages);
  ASSERT_OK(read);
  EXPECT_EQ(data, *read);
  auto stats = b->GetPoolStats(kPool);
  ASSERT_OK(stats);
  EXPECT_EQ(4u, stats->pools(0).cached_pages());
  EXPECT_EQ(4u, stats->pools(0).cache().referenced_pages());
  EXPECT_EQ(4u, stats->pools(0).cache().hits());
  // The pages are the cache's, not B's: B may read them, not free them.
  EXPECT_ERROR(FailedPrecondition, b->Free(kPool, found->pages));
  EXPECT_ERROR(
      FailedPrecondition,
      b->WritePages(kPool, found->pages, std::string(data.size(), 'x')));
  auto released = b->Release(kPool, found->pages);
  ASSERT_OK(released);
  EXPECT_EQ(4u, *released);
  // Without a reference, nothing to read, nothing left to release.
  EXPECT_ERROR(FailedPrecondition, b->ReadPages(kPool, found->pages));
  EXPECT_ERROR(FailedPrecondition, b->Release(kPool, found->pages));
  // A lookup without acquire still finds them, and takes no reference.
  auto peek = b->Lookup(kPool, kNs, Keys(4));
  ASSERT_OK(peek);
  EXPECT_EQ(4u, peek->hits);
  EXPECT_EQ(0u,
            b->GetPoolStats(kPool).value().pools(0).cache().referenced_pages());
}

TEST_F(CacheTest, AlreadyCachedKeysLeaveThePageToTheCaller) {
  std::string data;
  const std::vector<PageRange> first = WrittenPages(*a_, 2, 1, &data);
  ASSERT_OK(a_->Publish(kPool, kNs, Chain(first)));
  std::unique_ptr<Client> b = Connect("second");
  std::string other;
  const std::vector<PageRange> mine = WrittenPages(*b, 3, 2, &other);
  // Keys 0 and 1 are cached already; key 2 is new.
  const std::vector<CacheItem> items = Chain(mine);
  auto published = b->Publish(kPool, kNs, items, /*acquire=*/true);
  ASSERT_OK(published);
  EXPECT_EQ(1u, published->cached);
  EXPECT_EQ(2u, published->already_cached);
  ASSERT_EQ(3u, published->items.size());
  EXPECT_EQ(v1::PUBLISH_ALREADY_CACHED, published->items[0].outcome);
  EXPECT_EQ(first[0].first_page, published->items[0].page);
  EXPECT_EQ(v1::PUBLISH_ALREADY_CACHED, published->items[1].outcome);
  EXPECT_EQ(v1::PUBLISH_CACHED, published->items[2].outcome);
  EXPECT_EQ(items[2].page, published->items[2].page);
  const std::vector<PageRange> left = PagesNotCached(items, *published);
  ASSERT_EQ(1u, left.size());
  EXPECT_EQ(items[0].page, left[0].first_page);
  EXPECT_EQ(2u, left[0].num_pages);
  // With acquire B holds a reference on each key's page: the first
  // publisher's bytes for keys 0 and 1, its own for key 2.
  std::vector<PageRange> referenced;
  for (const PublishedPage& p : published->items)
    referenced.push_back({p.page, 1});
  auto read = b->ReadPages(kPool, referenced);
  ASSERT_OK(read);
  EXPECT_EQ(data + other.substr(2 * page_bytes_), *read);
  EXPECT_EQ(3u, b->Release(kPool, referenced).value());
  // The pages left to B are B's to free.
  EXPECT_EQ(2u, b->Free(kPool, left).value());
}

TEST_F(CacheTest, EvictionsAreListedFromACursor) {
  std::string data;
  // Every page of the pool, published as one chain.
  const uint64_t pages = a_->GetPoolStats(kPool).value().pools(0).capacity_pages();
  const std::vector<PageRange> all = WrittenPages(*a_, pages, 5, &data);
  ASSERT_OK(a_->Publish(kPool, kNs, Chain(all)));
  auto start = a_->ListEvictions(kPool, kNs, 0, 0);  // from now on
  ASSERT_OK(start);
  EXPECT_TRUE(start->keys.empty());
  std::unique_ptr<Client> b = Connect("hungry");
  ASSERT_OK(b->Alloc(kPool, 3 * 4));  // evicts the chain's last three, leaf first
  auto evicted = a_->ListEvictions(kPool, kNs, start->next);
  ASSERT_OK(evicted);
  const int last = static_cast<int>(pages) - 1;
  EXPECT_EQ((std::vector<std::string>{Key(last), Key(last - 1), Key(last - 2)}),
            evicted->keys);
  EXPECT_EQ(start->next + 3, evicted->next);
  EXPECT_EQ(0u, evicted->missed);
  // Paged: one key at a time gives the same, in order.
  auto first = a_->ListEvictions(kPool, kNs, start->next, 1);
  ASSERT_OK(first);
  EXPECT_EQ((std::vector<std::string>{Key(last)}), first->keys);
  auto rest = a_->ListEvictions(kPool, kNs, first->next, 10);
  ASSERT_OK(rest);
  EXPECT_EQ(2u, rest->keys.size());
  EXPECT_ERROR(InvalidArgument, a_->ListEvictions(kPool, kNs, 0, 65537));
  EXPECT_ERROR(NotFound, a_->ListEvictions("no-such-pool", kNs, 0));
}

TEST_F(CacheTest, OnePageUnderTwoKeysIsAConflict) {
  std::string data;
  const std::vector<PageRange> pages = WrittenPages(*a_, 1, 3, &data);
  const uint64_t page = pages[0].first_page;
  auto published =
      a_->Publish(kPool, kNs, {{Key(0), "", page}, {Key(1), "", page}});
  ASSERT_OK(published);
  EXPECT_EQ(1u, published->cached);
  ASSERT_EQ(2u, published->items.size());
  EXPECT_EQ(v1::PUBLISH_CACHED, published->items[0].outcome);
  EXPECT_EQ(v1::PUBLISH_CONFLICT, published->items[1].outcome);
  EXPECT_EQ(page, published->items[1].page);
  EXPECT_EQ(1u, a_->GetPoolStats(kPool).value().pools(0).cache().conflicts());
  // A cached page cannot be published again: it is no longer the session's.
  EXPECT_ERROR(FailedPrecondition,
               a_->Publish(kPool, kNs, {{Key(2), "", page}}));
}

TEST_F(CacheTest, CopyPagesGivesTheSessionPagesOfItsOwn) {
  std::string data;
  const std::vector<PageRange> pages = WrittenPages(*a_, 3, 4, &data);
  ASSERT_OK(a_->Publish(kPool, kNs, Chain(pages)));
  std::unique_ptr<Client> b = Connect("copier");
  auto found = b->Lookup(kPool, kNs, Keys(3), true);
  ASSERT_OK(found);
  ASSERT_EQ(3u, found->hits);
  auto own = b->Alloc(kPool, 3 * 4);
  ASSERT_OK(own);
  auto copied = b->CopyPages(kPool, found->pages, *own);
  ASSERT_OK(copied);
  EXPECT_EQ(3u, copied->pages);
  EXPECT_EQ(3 * page_bytes_, copied->bytes);
  EXPECT_EQ(3u, b->Release(kPool, found->pages).value());
  auto read = b->ReadPages(kPool, *own);
  ASSERT_OK(read);
  EXPECT_EQ(data, *read);
  // Unequal totals; a source the session does not reference.
  auto two = b->Alloc(kPool, 2 * 4);
  ASSERT_OK(two);
  EXPECT_ERROR(InvalidArgument, b->CopyPages(kPool, *own, *two));
  EXPECT_ERROR(FailedPrecondition,
               b->CopyPages(kPool, {{found->pages[0].first_page, 1}},
                            {{(*two)[0].first_page, 1}}));
}

TEST_F(CacheTest, ErrorsComeBackWithTheDaemonsCodes) {
  std::string data;
  const std::vector<PageRange> pages = WrittenPages(*a_, 1, 5, &data);
  EXPECT_ERROR(InvalidArgument, a_->Lookup(kPool, kNs, {""}));
  EXPECT_ERROR(InvalidArgument, a_->Lookup(kPool, kNs, {std::string(65, 'k')}));
  EXPECT_ERROR(InvalidArgument, a_->Lookup(kPool, kNs, {}));
  EXPECT_ERROR(InvalidArgument, a_->Lookup(kPool, "", {Key(0)}));
  EXPECT_ERROR(NotFound, a_->Lookup("no-such-pool", kNs, {Key(0)}));
  EXPECT_ERROR(InvalidArgument,
               a_->Publish(kPool, kNs, {{"", "", pages[0].first_page}}));
  EXPECT_ERROR(InvalidArgument,
               a_->Publish(kPool, kNs, {{Key(0), "", 1u << 30}}));
  std::unique_ptr<Client> b = Connect("other");
  // Another session's page (same uid, so the namespace is shared with it).
  EXPECT_ERROR(FailedPrecondition,
               b->Publish(kPool, kNs, {{Key(0), "", pages[0].first_page}}));
  EXPECT_ERROR(FailedPrecondition, b->Release(kPool, pages));
  // Nothing was published by the failed calls: all or nothing.
  auto found = a_->Lookup(kPool, kNs, {Key(0)});
  ASSERT_OK(found);
  EXPECT_EQ(0u, found->hits);
  EXPECT_TRUE(found->pages.empty());
}

}  // namespace
}  // namespace hostkv
