// PoolFill and MakeResident: a pool's segment made resident in chunks on a
// few threads, each chunk's pages handed over exactly once, the bytes
// already there kept; and SlotAllocator while its pool fills: only
// resident pages are handed out, an Allocate waits for them or fails with
// the caller's choice of code.
#include "server/pool/pool_fill.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/pool/resident_range.h"
#include "server/pool/slot_allocator.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

// A memfd of `bytes` (sparse: nothing reserved), mapped read-write.
class Memfd {
 public:
  explicit Memfd(uint64_t bytes) : bytes_(bytes) {
    fd_ = memfd_create("pool-fill-test", MFD_CLOEXEC);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(bytes)), 0);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(p, MAP_FAILED);
    base_ = static_cast<uint8_t*>(p);
  }
  ~Memfd() {
    munmap(base_, bytes_);
    close(fd_);
  }
  int fd() const { return fd_; }
  uint8_t* base() const { return base_; }
  // OS pages of the mapping resident in this process's page tables.
  uint64_t ResidentPages() const {
    std::vector<unsigned char> v((bytes_ + 4095) / 4096);
    EXPECT_EQ(mincore(base_, bytes_, v.data()), 0);
    uint64_t n = 0;
    for (unsigned char c : v) n += c & 1;
    return n;
  }

 private:
  uint64_t bytes_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
};

PoolGeometry Geometry(uint64_t pages) {
  PoolGeometry g;
  g.attention = Attention::kMha;
  g.layout = HostLayout::kLayerFirst;
  g.num_layers = 4;
  g.num_heads = 2;
  g.head_bytes = 256;
  g.page_size = 16;  // 64 KiB pages
  g.token_slots = pages * g.page_size;
  return g;
}

TEST(MakeResidentTest, ReservesAndMapsTheRangeAndKeepsItsBytes) {
  Memfd m(8 << 20);
  EXPECT_EQ(m.ResidentPages(), 0u);
  std::memset(m.base() + (1 << 20), 0xab, 4096);  // one page already there
  ResidentMethod method = ResidentMethod::kTouch;
  ASSERT_OK(MakeResident(m.base(), {0, 4 << 20}, m.fd(), &method));
  // This kernel (>= 5.14) takes MADV_POPULATE_WRITE.
  EXPECT_EQ(method, ResidentMethod::kPopulate);
  EXPECT_GE(m.ResidentPages(), 1024u);
  EXPECT_LT(m.ResidentPages(), 2048u);
  EXPECT_EQ(m.base()[(1 << 20) + 17], 0xab);
  EXPECT_EQ(m.base()[(1 << 20) + 4096], 0);
  TouchResident(m.base() + (4 << 20), 4 << 20);
  EXPECT_EQ(m.ResidentPages(), 2048u);
  EXPECT_EQ(m.base()[(1 << 20) + 4095], 0xab);
}

TEST(MakeResidentTest, MemoryThatCannotBeHadIsAnErrorNotASigbus) {
  Memfd m(2 << 20);
  // The file is cut to 1 MiB under the 2 MiB mapping: a touch of the
  // second MiB would be a SIGBUS; the populate says so instead.
  ASSERT_EQ(ftruncate(m.fd(), 1 << 20), 0);
  ResidentMethod method;
  EXPECT_OK(MakeResident(m.base(), {0, 1 << 20}, m.fd(), &method));
  EXPECT_ERROR(ResourceExhausted,
               MakeResident(m.base(), {1 << 20, 1 << 20}, m.fd(), &method));
}

TEST(PoolFillTest, HandsOverEveryPageOnceAndEndsReady) {
  const PoolGeometry g = Geometry(100);  // 6.25 MiB
  Memfd m(g.total_bytes());
  absl::Mutex mu;
  std::vector<int> handed(g.num_pages(), 0);
  std::atomic<int> done_calls{0};
  absl::Status done_status = absl::UnknownError("not called");
  {
    PoolFill fill(
        "p", g, m.base(), m.fd(), PoolFillOptions{3, 256 << 10},
        [&](const PageRun& chunk) {
          absl::MutexLock lock(&mu);
          for (uint64_t p = chunk.first_page; p < chunk.first_page + chunk.num_pages; ++p) {
            ++handed[p];
          }
        },
        [&](const absl::Status& s) {
          done_status = s;
          ++done_calls;
        });
    ASSERT_OK(fill.Wait());
    const PoolFill::Progress p = fill.progress();
    EXPECT_EQ(p.state, v1::FILL_READY);
    EXPECT_EQ(p.ready_pages, g.num_pages());
    EXPECT_EQ(p.total_pages, g.num_pages());
    EXPECT_EQ(p.threads, 3u);
    EXPECT_EQ(p.method, ResidentMethod::kPopulate);
  }
  EXPECT_EQ(done_calls.load(), 1);
  EXPECT_OK(done_status);
  for (uint64_t p = 0; p < g.num_pages(); ++p) EXPECT_EQ(handed[p], 1) << p;
  EXPECT_EQ(m.ResidentPages(), g.total_bytes() / 4096);
}

TEST(PoolFillTest, StoppedEarlyItIsCancelledAndHandsOverOnlyFilledChunks) {
  const PoolGeometry g = Geometry(4096);  // 256 MiB, one page per chunk
  Memfd m(g.total_bytes());
  std::atomic<uint64_t> handed{0};
  PoolFill fill("p", g, m.base(), m.fd(), PoolFillOptions{1, 1},
                [&](const PageRun& chunk) { handed += chunk.num_pages; },
                nullptr);
  fill.Stop();  // long before 256 MiB are resident
  EXPECT_ERROR(Cancelled, fill.Wait());
  const PoolFill::Progress p = fill.progress();
  EXPECT_EQ(p.state, v1::FILL_FAILED);
  EXPECT_EQ(p.ready_pages, handed.load());
  EXPECT_LT(p.ready_pages, g.num_pages());
}

TEST(PoolFillTest, AnErrorEndsTheFillAndLeavesTheRestUnready) {
  const PoolGeometry g = Geometry(64);
  Memfd m(g.total_bytes());
  ASSERT_EQ(ftruncate(m.fd(), 0), 0);  // nothing can be made resident
  std::atomic<uint64_t> handed{0};
  PoolFill fill("p", g, m.base(), m.fd(), PoolFillOptions{2, 1 << 20},
                [&](const PageRun& chunk) { handed += chunk.num_pages; },
                nullptr);
  EXPECT_ERROR(ResourceExhausted, fill.Wait());
  EXPECT_EQ(handed.load(), 0u);
  EXPECT_EQ(fill.progress().state, v1::FILL_FAILED);
  EXPECT_NE(fill.progress().error.find("MADV_POPULATE_WRITE"), std::string::npos)
      << fill.progress().error;
}

constexpr OwnerTag kAlice = 1;

TEST(SlotAllocatorFillTest, OnlyResidentPagesAreHandedOut) {
  SlotAllocator alloc(10, nullptr, /*resident=*/false);
  // Unready pages count as free (nothing holds them) but are not ready.
  EXPECT_EQ(alloc.free_pages(), 10u);
  EXPECT_EQ(alloc.ready_pages(), 0u);
  EXPECT_ERROR(FailedPrecondition, alloc.Allocate(1, kAlice, absl::InfinitePast()));
  alloc.AddResident({4, 3});
  EXPECT_EQ(alloc.ready_pages(), 3u);
  ASSIGN_OR_FAIL(runs, alloc.Allocate(2, kAlice, absl::InfinitePast()));
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], (PageRun{4, 2}));
  EXPECT_EQ(alloc.free_pages(), 8u);
  // Two more than are ready: fails at once, or after the wait.
  EXPECT_ERROR(FailedPrecondition, alloc.Allocate(3, kAlice, absl::InfinitePast()));
  EXPECT_ERROR(DeadlineExceeded,
               alloc.Allocate(3, kAlice, absl::Now() + absl::Milliseconds(30)));
  // More than the pool could ever hold: full, whatever the fill.
  EXPECT_ERROR(ResourceExhausted, alloc.Allocate(9, kAlice, absl::InfiniteFuture()));
}

TEST(SlotAllocatorFillTest, AWaitingAllocateIsServedAsPagesTurnResident) {
  SlotAllocator alloc(8, nullptr, /*resident=*/false);
  alloc.AddResident({0, 2});
  absl::StatusOr<std::vector<PageRun>> got;
  std::thread waiter([&] {
    got = alloc.Allocate(5, kAlice, absl::Now() + absl::Seconds(30));
  });
  absl::SleepFor(absl::Milliseconds(20));
  alloc.AddResident({2, 2});
  absl::SleepFor(absl::Milliseconds(20));
  alloc.AddResident({4, 4});  // now 8 ready: the waiter takes 5
  waiter.join();
  ASSERT_OK(got);
  uint64_t pages = 0;
  for (const PageRun& r : *got) pages += r.num_pages;
  EXPECT_EQ(pages, 5u);
  EXPECT_EQ(alloc.free_pages(), 3u);
  EXPECT_EQ(alloc.ready_pages(), 8u);
}

TEST(SlotAllocatorFillTest, AFailedFillEndsTheWaitAsFull) {
  SlotAllocator alloc(8, nullptr, /*resident=*/false);
  alloc.AddResident({0, 2});
  absl::StatusOr<std::vector<PageRun>> got;
  std::thread waiter([&] { got = alloc.Allocate(4, kAlice); });
  absl::SleepFor(absl::Milliseconds(20));
  alloc.EndFill();  // the 6 others never turn resident
  waiter.join();
  EXPECT_ERROR(ResourceExhausted, got);
  EXPECT_NE(std::string(got.status().message()).find("never made resident"),
            std::string::npos)
      << got.status();
  ASSERT_OK(alloc.Allocate(2, kAlice, absl::InfinitePast()));
}

TEST(SlotAllocatorFillTest, RestoreRefusesAFillingPool) {
  SlotAllocator alloc(4, nullptr, /*resident=*/false);
  std::vector<OwnerTag> owners(4, kNoOwner);
  EXPECT_ERROR(FailedPrecondition, alloc.Restore(owners));
}

}  // namespace
}  // namespace hostkv
