// A daemon's state handed to the next one: the state keeper holds the
// descriptors, and PoolRegistry::Adopt keeps what the ledger proves (the
// pages of sessions that survive, proven cached keys) and zeroes the rest.
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/pool/pool_registry.h"
#include "server/state/keeper_protocol.h"
#include "server/state/pool_ledger.h"
#include "server/state/state_keeper.h"
#include "tests/testing/status_matchers.h"


namespace hostkv {
namespace {

constexpr uint32_t kPageSize = 4;
constexpr uint64_t kCapacityPages = 32;
constexpr uint64_t kPages = kCapacityPages + 1;  // SGLang's padding page

v1::PoolSpec Spec() {
  v1::PoolSpec spec;
  spec.set_name("kept");
  spec.set_layout(v1::LAYOUT_PAGE_FIRST);
  spec.set_page_size(kPageSize);
  spec.set_capacity_tokens(kCapacityPages * kPageSize);
  spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  // MLA, page_first: one plane, each page's bytes contiguous.
  spec.mutable_geometry()->mutable_mla()->set_num_layers(2);
  spec.mutable_geometry()->mutable_mla()->set_kv_lora_rank(8);
  spec.mutable_geometry()->mutable_mla()->set_qk_rope_head_dim(8);
  return spec;
}

// A state keeper in a child process, on its own socket.
class KeeperProcess {
 public:
  KeeperProcess() {
    char tmpl[] = "/tmp/hostkv-keeper-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/hostkvd.sock" + kStateSocketSuffix;
    pid_ = fork();
    if (pid_ == 0) _exit(RunStateKeeper(path_, absl::Seconds(60)));
    for (int i = 0; i < 500 && access(path_.c_str(), F_OK) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~KeeperProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::system(("rm -rf " + dir_).c_str());
  }
  const std::string& path() const { return path_; }
  // The keeper's exit code within `seconds`, or -1.
  int WaitExit(int seconds) {
    for (int i = 0; i < seconds * 100; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

 private:
  std::string dir_;
  std::string path_;
  pid_t pid_ = -1;
};

TEST(StateKeeperTest, HoldsDescriptorsUntilTheNextDaemonCollectsThem) {
  KeeperProcess keeper;
  ScopedFd memfd(memfd_create("kept", MFD_CLOEXEC));
  ASSERT_EQ(write(memfd.get(), "state", 5), 5);
  {
    ASSIGN_OR_FAIL(daemon, StateKeeper::Connect(keeper.path(), false, absl::Seconds(60)));
    ASSERT_OK(daemon->Deposit("a", memfd.get()));
    ASSERT_OK(daemon->Deposit("b", memfd.get()));
    ASSERT_OK(daemon->Remove("b"));
  }  // the daemon is gone; so is its descriptor
  memfd = ScopedFd();
  ASSIGN_OR_FAIL(next, StateKeeper::Connect(keeper.path(), false, absl::Seconds(60)));
  ASSIGN_OR_FAIL(items, next->Collect());
  ASSERT_EQ(items.size(), 1u);
  ASSERT_TRUE(items.contains("a"));
  char bytes[5] = {};
  ASSERT_EQ(pread(items["a"].get(), bytes, 5, 0), 5);
  EXPECT_EQ(std::string(bytes, 5), "state");
  ASSERT_OK(next->Discard());
  EXPECT_EQ(keeper.WaitExit(5), 0);
  EXPECT_NE(access(keeper.path().c_str(), F_OK), 0) << "the socket stays";
}

TEST(StateKeeperTest, NoKeeperAndNoSpawnIsUnavailable) {
  EXPECT_ERROR(Unavailable, StateKeeper::Connect("/tmp/hostkv-no-such.sock.state",
                                                 false, absl::Seconds(1)));
}

class AdoptionTest : public ::testing::Test {
 protected:
  static constexpr OwnerTag kKept = 5;     // resumes after the restart
  static constexpr OwnerTag kGone = 6;     // does not
  static constexpr OwnerTag kPublisher = 7;

  uint8_t* Page(HostPool& pool, uint64_t page) {
    return pool.base() + page * pool.geometry().page_bytes();
  }
  bool PageIs(HostPool& pool, uint64_t page, uint8_t value) {
    const uint8_t* p = Page(pool, page);
    for (uint64_t i = 0; i < pool.geometry().page_bytes(); ++i) {
      if (p[i] != value) return false;
    }
    return true;
  }

  // The first daemon: pages of three sessions, two of them published; with
  // `cut_publish`, it dies in the middle of two more Publishes, after their
  // pages moved to the cache and before their keys were recorded: one by the
  // kept session (two pages), one by the gone session (one page).
  void RunFirstDaemon(bool cut_publish = false) {
    ASSIGN_OR_FAIL(keeper, StateKeeper::Connect(keeper_.path(), false, absl::Seconds(60)));
    PoolRegistry first(&budget_, "/hostkv-test.", PoolFillOptions{1});
    first.set_keeper(keeper.get());
    ASSIGN_OR_FAIL(pool, first.Create(Spec(), false, v1::PoolOwner(), Principal{}));
    ASSIGN_OR_FAIL(kept, pool->allocator().Allocate(3, kKept));
    ASSIGN_OR_FAIL(gone, pool->allocator().Allocate(2, kGone));
    ASSIGN_OR_FAIL(published, pool->allocator().Allocate(2, kPublisher));
    kept_ = kept;
    gone_page_ = gone[0].first_page;
    for (const PageRun& r : kept) {
      for (uint64_t p = r.first_page; p < r.first_page + r.num_pages; ++p) {
        std::memset(Page(*pool, p), 0xa5, pool->geometry().page_bytes());
      }
    }
    std::memset(Page(*pool, gone_page_), 0x66, pool->geometry().page_bytes());
    parent_page_ = published[0].first_page;
    child_page_ = parent_page_ + 1;
    std::memset(Page(*pool, parent_page_), 0x71, pool->geometry().page_bytes());
    std::memset(Page(*pool, child_page_), 0x72, pool->geometry().page_bytes());
    ASSERT_OK(pool->allocator().Cache(published, kPublisher));
    ASSERT_OK(pool->namespaces().ClaimOrCheck("kept", "ns", Principal{}));
    const PublishItem items[] = {{"k0", "", parent_page_},
                                 {"k1", "k0", child_page_}};
    ASSERT_OK(pool->cache().Publish("ns", items, false, kPublisher));
    // Confirmed: the cache recorded their keys.
    pool->allocator().ConfirmCached({parent_page_, child_page_});
    if (cut_publish) {
      ASSIGN_OR_FAIL(moving, pool->allocator().Allocate(2, kKept));
      ASSIGN_OR_FAIL(moving_gone, pool->allocator().Allocate(1, kGone));
      moving_ = moving;
      for (const PageRun& r : moving) {
        for (uint64_t p = r.first_page; p < r.first_page + r.num_pages; ++p) {
          std::memset(Page(*pool, p), 0x5c, pool->geometry().page_bytes());
        }
      }
      ASSERT_OK(pool->allocator().Cache(moving, kKept, absl::InfiniteFuture()));
      ASSERT_OK(pool->allocator().Cache(moving_gone, kGone, absl::InfiniteFuture()));
    }
    // The daemon dies here: nothing is cleaned up, the keeper holds on.
  }

  struct Adopted {
    std::shared_ptr<HostPool> pool;
    PoolAdoption report;
  };
  // The next daemon, adopting what the keeper holds, with `edit` applied to
  // the ledger's bytes first.
  void Adopt(Adopted* out, void (*edit)(uint8_t* ledger, uint64_t child_page) = nullptr) {
    ASSIGN_OR_FAIL(keeper, StateKeeper::Connect(keeper_.path(), false, absl::Seconds(60)));
    ASSIGN_OR_FAIL(items, keeper->Collect());
    ASSERT_TRUE(items.contains(PoolLedgerKeepName("kept")));
    ASSERT_TRUE(items.contains(PoolSegmentKeepName("kept")));
    ScopedFd ledger_fd = std::move(items[PoolLedgerKeepName("kept")]);
    if (edit != nullptr) {
      const uint64_t bytes = PoolLedger::BytesFor(kPages);
      void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                       ledger_fd.get(), 0);
      ASSERT_NE(map, MAP_FAILED);
      edit(static_cast<uint8_t*>(map), child_page_);
      munmap(map, bytes);
    }
    ASSIGN_OR_FAIL(ledger, PoolLedger::Open(std::move(ledger_fd), "the ledger"));
    second_ = std::make_unique<PoolRegistry>(&budget2_, "/hostkv-test.", PoolFillOptions{1});
    second_->set_keeper(keeper.get());
    second_->namespaces().Adopt("ns", NamespaceOwner{true, 0});
    const absl::flat_hash_set<OwnerTag> live = {kKept};
    ASSIGN_OR_FAIL(pool, second_->Adopt(std::move(ledger),
                                        std::move(items[PoolSegmentKeepName("kept")]),
                                        live, &out->report));
    out->pool = pool;
    keeper_client_ = std::move(keeper);
  }

  KeeperProcess keeper_;
  MemoryBudget budget_{0, 0, [] { return uint64_t{1} << 40; }};
  MemoryBudget budget2_{0, 0, [] { return uint64_t{1} << 40; }};
  std::unique_ptr<StateKeeper> keeper_client_;
  std::unique_ptr<PoolRegistry> second_;
  std::vector<PageRun> kept_;
  std::vector<PageRun> moving_;
  uint64_t gone_page_ = 0, parent_page_ = 0, child_page_ = 0;
};

TEST_F(AdoptionTest, KeepsLiveSessionsPagesAndProvenKeys) {
  RunFirstDaemon();
  Adopted a;
  Adopt(&a);
  ASSERT_NE(a.pool, nullptr);
  HostPool& pool = *a.pool;
  EXPECT_EQ(a.report.pages_owned, 3u);
  EXPECT_EQ(a.report.pages_cached, 2u);
  EXPECT_EQ(a.report.pages_dropped, 2u);  // the gone session's two pages
  EXPECT_EQ(a.report.keys_dropped, 0u);
  EXPECT_EQ(pool.allocator().pages_owned_by(kKept), 3u);
  EXPECT_EQ(pool.allocator().pages_owned_by(kGone), 0u);
  EXPECT_EQ(pool.allocator().cached_pages(), 2u);
  EXPECT_EQ(pool.allocator().free_pages(), kPages - 5);
  EXPECT_OK(pool.allocator().CheckOwned(kept_, kKept));
  for (const PageRun& r : kept_) {
    for (uint64_t p = r.first_page; p < r.first_page + r.num_pages; ++p) {
      EXPECT_TRUE(PageIs(pool, p, 0xa5)) << "page " << p;
    }
  }
  ASSIGN_OR_FAIL(found, pool.cache().Lookup("ns", {"k0", "k1"}, false, kKept));
  EXPECT_EQ(found.hits, 2u);
  EXPECT_EQ(found.pages, (std::vector<uint64_t>{parent_page_, child_page_}));
  EXPECT_TRUE(PageIs(pool, child_page_, 0x72));
  EXPECT_OK(pool.cache().CheckConsistency());
  // The parent stays while its child is cached.
  EXPECT_EQ(pool.cache().Evict(1), (std::vector<uint64_t>{child_page_}));
  // Every free page comes back zeroed: the gone session's bytes included.
  ASSIGN_OR_FAIL(rest, pool.allocator().Allocate(kPages - 5, 9));
  for (const PageRun& r : rest) {
    for (uint64_t p = r.first_page; p < r.first_page + r.num_pages; ++p) {
      EXPECT_TRUE(PageIs(pool, p, 0)) << "page " << p;
    }
  }
}

TEST_F(AdoptionTest, ATornRecordDropsItsKeyAndZeroesItsPage) {
  RunFirstDaemon();
  Adopted a;
  Adopt(&a, [](uint8_t* ledger, uint64_t child) {
    // A byte of the child's cache record (after the owner words, 4 KiB
    // aligned), as a crash in the middle of writing it would leave it.
    const uint64_t records = (4096 + 8 * kPages + 4095) / 4096 * 4096;
    ledger[records + 224 * child + 30] ^= 0x5a;
  });
  ASSERT_NE(a.pool, nullptr);
  HostPool& pool = *a.pool;
  EXPECT_EQ(a.report.keys_dropped, 1u);
  EXPECT_EQ(a.report.pages_cached, 1u);
  EXPECT_EQ(pool.allocator().cached_pages(), 1u);
  ASSIGN_OR_FAIL(found, pool.cache().Lookup("ns", {"k0", "k1"}, false, kKept));
  EXPECT_EQ(found.hits, 1u);
  EXPECT_FALSE(pool.cache().IsCached(child_page_));
  EXPECT_OK(pool.cache().CheckConsistency());
  // Neither cached nor anybody's: free, and zero before it is handed out.
  ASSIGN_OR_FAIL(rest, pool.allocator().Allocate(pool.allocator().free_pages(), 9));
  bool saw_child = false;
  for (const PageRun& r : rest) {
    for (uint64_t p = r.first_page; p < r.first_page + r.num_pages; ++p) {
      saw_child |= p == child_page_;
      EXPECT_TRUE(PageIs(pool, p, 0)) << "page " << p;
    }
  }
  EXPECT_TRUE(saw_child);
}

TEST_F(AdoptionTest, AKeyOfANamespaceWithoutOwnerIsNotServed) {
  RunFirstDaemon();
  ASSIGN_OR_FAIL(keeper, StateKeeper::Connect(keeper_.path(), false, absl::Seconds(60)));
  ASSIGN_OR_FAIL(items, keeper->Collect());
  ASSIGN_OR_FAIL(ledger, PoolLedger::Open(std::move(items[PoolLedgerKeepName("kept")]), "l"));
  PoolRegistry second(&budget2_, "/hostkv-test.", PoolFillOptions{1});
  PoolAdoption report;
  ASSIGN_OR_FAIL(pool, second.Adopt(std::move(ledger),
                                    std::move(items[PoolSegmentKeepName("kept")]),
                                    {kKept}, &report));
  EXPECT_EQ(report.keys_dropped, 2u);
  EXPECT_EQ(pool->allocator().cached_pages(), 0u);
  ASSIGN_OR_FAIL(found, pool->cache().Lookup("ns", {"k0"}, false, kKept));
  EXPECT_EQ(found.hits, 0u);
}

// A Publish cut between moving its pages to the cache and recording their
// keys: the ledger says "being published by session N", so the next daemon
// gives them back to that session (its bytes intact), or drops them if the
// session did not survive; nothing is cached without its key.
TEST_F(AdoptionTest, APublishCutBeforeItsKeysGivesThePagesBack) {
  RunFirstDaemon(/*cut_publish=*/true);
  Adopted a;
  Adopt(&a);
  ASSERT_NE(a.pool, nullptr);
  HostPool& pool = *a.pool;
  EXPECT_EQ(a.report.pages_owned, 5u);    // 3 + the 2 of the cut Publish
  EXPECT_EQ(a.report.pages_cached, 2u);   // only the keys recorded
  EXPECT_EQ(a.report.pages_dropped, 3u);  // the gone session's 2 + its 1
  EXPECT_EQ(pool.allocator().pages_owned_by(kKept), 5u);
  EXPECT_EQ(pool.allocator().cached_pages(), 2u);
  EXPECT_OK(pool.allocator().CheckOwned(moving_, kKept));
  for (const PageRun& r : moving_) {
    for (uint64_t p = r.first_page; p < r.first_page + r.num_pages; ++p) {
      EXPECT_TRUE(PageIs(pool, p, 0x5c)) << "page " << p;
    }
  }
  EXPECT_OK(pool.cache().CheckConsistency());
}

// A pool deleted while another of the same name is created: the new pool's
// descriptors stay with the keeper (the deletion lets go of the old pool's
// before the new one can deposit its own under the same names). The
// creation starts from the observer the deletion tells that the old pool
// is gone, and is given time to deposit before the deletion goes on.
TEST(PoolKeepingTest, APoolCreatedAsItsNamesakeIsDeletedStaysKept) {
  KeeperProcess keeper_process;
  ASSIGN_OR_FAIL(keeper, StateKeeper::Connect(keeper_process.path(), false,
                                              absl::Seconds(60)));
  MemoryBudget budget{0, 0, [] { return uint64_t{1} << 40; }};
  PoolRegistry registry(&budget, "/hostkv-test-race.", PoolFillOptions{1});
  registry.set_keeper(keeper.get());
  const Principal root{PeerCredentials{}};  // uid 0
  v1::PoolSpec first = Spec();
  first.set_name("raced");
  v1::PoolSpec second = first;
  second.set_capacity_tokens(2 * first.capacity_tokens());
  std::atomic<bool> armed{false};
  std::thread creator;
  std::atomic<bool> created{false};
  registry.SetObserver([&](const std::string& pool, bool serving) {
    if (pool != "raced" || serving || !armed.exchange(false)) return;
    creator = std::thread([&] {
      EXPECT_OK(registry.Create(second, false, v1::PoolOwner(), Principal{})
                    .status());
      created = true;
    });
    // Its deposits come before its own Notify, which waits for this one.
    absl::SleepFor(absl::Milliseconds(300));
  });
  ASSERT_OK(
      registry.Create(first, false, v1::PoolOwner(), Principal{}).status());
  armed = true;
  ASSERT_OK(registry.Delete("raced", root));
  creator.join();
  ASSERT_TRUE(created);
  registry.SetObserver(nullptr);
  ASSIGN_OR_FAIL(pool, registry.Get("raced"));
  ASSIGN_OR_FAIL(items, keeper->Collect());
  ASSERT_TRUE(items.contains(PoolSegmentKeepName("raced")));
  ASSERT_TRUE(items.contains(PoolLedgerKeepName("raced")));
  // And they are the new pool's.
  struct stat kept {};
  ASSERT_EQ(0, fstat(items[PoolSegmentKeepName("raced")].get(), &kept));
  EXPECT_GE(static_cast<uint64_t>(kept.st_size),
            pool->geometry().total_bytes());
}

}  // namespace
}  // namespace hostkv
