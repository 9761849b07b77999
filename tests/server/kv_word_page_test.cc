// The daemon's "KV written" page on the CPU: a sealed one-page memfd whose
// word a second mapping (the engine's) shares, released by a CPU store.
#include "server/transfer/kv_word_page.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr int kAllSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

TEST(KvWordPageTest, IsOneZeroedPageSealedAgainstResizing) {
  auto page = KvWordPage::Create();
  ASSERT_OK(page);
  struct stat st{};
  ASSERT_EQ(0, fstat((*page)->fd(), &st));
  EXPECT_EQ(4096, st.st_size);
  EXPECT_EQ(kAllSeals, fcntl((*page)->fd(), F_GET_SEALS) & kAllSeals);
  EXPECT_NE(0, ftruncate((*page)->fd(), 0)) << "shrinking is sealed";
  EXPECT_NE(0, ftruncate((*page)->fd(), 8192)) << "growing is sealed";
  EXPECT_NE(0, fcntl((*page)->fd(), F_ADD_SEALS, F_SEAL_WRITE))
      << "the engine must not seal writes away";
  EXPECT_EQ(0u, (*page)->Load());
  EXPECT_EQ(static_cast<void*>((*page)->word()), (*page)->page());
}

TEST(KvWordPageTest, AnotherMappingSharesTheWordAndSeesTheRelease) {
  auto page = KvWordPage::Create();
  ASSERT_OK(page);
  auto copy = (*page)->Duplicate();
  ASSERT_OK(copy);
  EXPECT_NE((*page)->fd(), copy->get());
  EXPECT_NE(0, fcntl(copy->get(), F_GETFD) & FD_CLOEXEC);
  void* engine = mmap(nullptr, KvWordPage::kPageBytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED, copy->get(), 0);
  ASSERT_NE(MAP_FAILED, engine);
  std::atomic_ref<uint64_t> word(*static_cast<uint64_t*>(engine));
  word.store(41);  // the engine's mark
  EXPECT_EQ(41u, (*page)->Load());
  (*page)->Release();
  EXPECT_EQ(KvWordPage::kReleased, word.load());
  EXPECT_EQ((1ull << 63) - 1, KvWordPage::kReleased);
  munmap(engine, KvWordPage::kPageBytes);
}

TEST(KvWordPageTest, PagesAreIndependent) {
  auto a = KvWordPage::Create();
  auto b = KvWordPage::Create();
  ASSERT_OK(a);
  ASSERT_OK(b);
  (*a)->Release();
  EXPECT_EQ(KvWordPage::kReleased, (*a)->Load());
  EXPECT_EQ(0u, (*b)->Load());
}

}  // namespace
}  // namespace hostkv
