#include "server/tier/file_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/page_format.h"
#include "server/tier/tier_value.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

PoolGeometry TestGeometry() {
  PoolGeometry g;
  g.attention = Attention::kMha;
  g.layout = HostLayout::kLayerFirst;
  g.num_layers = 3;
  g.num_heads = 2;
  g.head_bytes = 8;
  g.page_size = 4;
  g.token_slots = 16;
  return g;
}

// Removes a directory tree (the test's own temp root).
void RemoveTree(const std::string& path) {
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      const std::string child = path + "/" + name;
      struct stat st;
      if (::lstat(child.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        RemoveTree(child);
      } else {
        ::unlink(child.c_str());
      }
    }
    ::closedir(d);
  }
  ::rmdir(path.c_str());
}

// Every regular file under `path`, recursively.
void ListFiles(const std::string& path, std::vector<std::string>* out) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string child = path + "/" + name;
    struct stat st;
    if (::lstat(child.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      ListFiles(child, out);
    } else {
      out->push_back(child);
    }
  }
  ::closedir(d);
}

// The permission bits of `path` itself (not of what a symlink names); -1
// if it is not there.
int ModeOf(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 07777);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Sets the umask for its lifetime.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(old_); }

 private:
  const mode_t old_;
};

// What spdlog's default logger writes while it lives.
class ScopedLogCapture {
 public:
  ScopedLogCapture()
      : old_(spdlog::default_logger()),
        sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    spdlog::set_default_logger(
        std::make_shared<spdlog::logger>("file_tier_test", sink_));
  }
  ~ScopedLogCapture() { spdlog::set_default_logger(old_); }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  const std::shared_ptr<spdlog::logger> old_;
  const std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

class FileTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/file_tier_test.XXXXXX");
    ASSERT_NE(nullptr, ::mkdtemp(pattern.data()));
    parent_ = pattern;
    root_ = parent_ + "/root";
    ASSERT_EQ(0, ::mkdir(root_.c_str(), 0700));
    auto tier = FileTier::Open(root_);
    ASSERT_OK(tier);
    tier_ = std::move(*tier);
  }
  void TearDown() override { RemoveTree(parent_); }

  // A real page: host page `page` of a pool filled with a pattern, in the
  // flat format, framed.
  std::string FramedPage(uint64_t page, uint8_t seed) {
    std::vector<uint8_t> pool(geometry_.total_bytes());
    for (size_t i = 0; i < pool.size(); ++i) {
      pool[i] = static_cast<uint8_t>(i * 31 + seed);
    }
    std::string flat(geometry_.page_bytes(), '\0');
    CopyPageToFlat(geometry_, pool.data(), page,
                   reinterpret_cast<uint8_t*>(flat.data()));
    return FrameValue(fingerprint_, flat);
  }

  absl::Status PutOne(FileTier& tier, const TierKey& key,
                      const std::string& value) {
    const absl::string_view v = value;
    std::vector<absl::Status> s = tier.Put({key}, {v});
    return s.at(0);
  }
  absl::StatusOr<std::string> GetOne(FileTier& tier, const TierKey& key) {
    return std::move(tier.Get({key}).at(0));
  }

  const PoolGeometry geometry_ = TestGeometry();
  const uint64_t fingerprint_ = GeometryFingerprint(geometry_, 2);
  std::string parent_;
  std::string root_;
  std::unique_ptr<FileTier> tier_;
};

TEST_F(FileTierTest, PutGetCountPrefixDeleteRoundTrip) {
  const std::vector<TierKey> keys = {{"llama/tp0", std::string(32, '\x01')},
                                     {"llama/tp0", std::string(32, '\x02')},
                                     {"llama/tp0", std::string(32, '\x03')}};
  const std::vector<std::string> values = {FramedPage(0, 1), FramedPage(1, 1),
                                           FramedPage(2, 1)};
  ASSERT_NE(values[0], values[1]);
  std::vector<absl::string_view> views(values.begin(), values.end());
  EXPECT_EQ(0u, *tier_->CountPrefix(keys));
  for (const absl::Status& s : tier_->Put(keys, views)) EXPECT_OK(s);

  auto got = tier_->Get(keys);
  ASSERT_EQ(3u, got.size());
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_OK(got[i]);
    EXPECT_EQ(values[i], *got[i]);
    auto page = UnframeValue(*got[i], fingerprint_, geometry_.page_bytes());
    ASSERT_OK(page);
    EXPECT_EQ(values[i].substr(kTierValueHeaderBytes), std::string(*page));
  }
  EXPECT_EQ(3u, *tier_->CountPrefix(keys));

  // A gap stops the count; a key never written is NotFound.
  ASSERT_OK(tier_->Delete({keys[1]}));
  EXPECT_EQ(1u, *tier_->CountPrefix(keys));
  EXPECT_ERROR(NotFound, GetOne(*tier_, keys[1]));
  EXPECT_ERROR(NotFound, GetOne(*tier_, {"other", "k"}));
  EXPECT_EQ(0u, *tier_->CountPrefix({TierKey{"other", "k"}, keys[0]}));
  // Deleting what is absent is fine.
  EXPECT_OK(tier_->Delete({keys[1], TierKey{"never", "x"}}));

  // A second Put replaces the value.
  ASSERT_OK(PutOne(*tier_, keys[0], values[2]));
  EXPECT_EQ(values[2], *GetOne(*tier_, keys[0]));

  ASSERT_OK(tier_->Delete(keys));
  EXPECT_EQ(0u, *tier_->CountPrefix(keys));
  EXPECT_EQ("file:" + root_, tier_->Describe());
}

TEST_F(FileTierTest, LayoutIsDocumented) {
  const TierKey key{"ab", "\x12\x34"};
  EXPECT_EQ(root_ + "/ns-6162/12/k-1234", tier_->PathOf(key));
  EXPECT_EQ(root_ + "/ns-/__/k-", tier_->PathOf({"", ""}));
  ASSERT_OK(PutOne(*tier_, key, "v"));
  std::ifstream in(root_ + "/ns-6162/12/k-1234");
  std::string content((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ("v", content);
}

TEST_F(FileTierTest, NoFsyncOptionWorksToo) {
  auto tier = FileTier::Open(root_, FileTierOptions{.fsync = false});
  ASSERT_OK(tier);
  const std::string value = FramedPage(3, 9);
  ASSERT_OK(PutOne(**tier, {"ns", "k"}, value));
  EXPECT_EQ(value, *GetOne(**tier, {"ns", "k"}));
}

// Two daemons on one directory: each sees what the other wrote and deleted.
TEST_F(FileTierTest, TwoTiersOnOneDirectoryShareThePages) {
  auto other = FileTier::Open(root_ + "/");
  ASSERT_OK(other);
  const TierKey a{"ns", "page-a"}, b{"ns", "page-b"};
  const std::string va = FramedPage(0, 5), vb = FramedPage(1, 6);
  ASSERT_OK(PutOne(*tier_, a, va));
  ASSERT_OK(PutOne(**other, b, vb));
  EXPECT_EQ(va, *GetOne(**other, a));
  EXPECT_EQ(vb, *GetOne(*tier_, b));
  EXPECT_EQ(2u, *(*other)->CountPrefix({a, b}));
  EXPECT_EQ(2u, *tier_->CountPrefix({a, b}));
  ASSERT_OK((*other)->Delete({a}));
  EXPECT_ERROR(NotFound, GetOne(*tier_, a));
  EXPECT_EQ(0u, *tier_->CountPrefix({a, b}));
}

// A torn file (truncated by a crash of a non-atomic writer, or by hand) is
// read as it is; its frame makes it a miss.
TEST_F(FileTierTest, TruncatedFileIsDataLossAfterGet) {
  const TierKey key{"ns", "torn"};
  const std::string value = FramedPage(2, 3);
  ASSERT_OK(PutOne(*tier_, key, value));
  ASSERT_EQ(0, ::truncate(tier_->PathOf(key).c_str(), value.size() / 2));
  auto got = GetOne(*tier_, key);
  ASSERT_OK(got);
  EXPECT_EQ(value.substr(0, value.size() / 2), *got);
  EXPECT_ERROR(DataLoss,
               UnframeValue(*got, fingerprint_, geometry_.page_bytes()));
  // Truncated into the header: still a miss, not a crash.
  ASSERT_EQ(0, ::truncate(tier_->PathOf(key).c_str(), 5));
  got = GetOne(*tier_, key);
  ASSERT_OK(got);
  EXPECT_ERROR(DataLoss,
               UnframeValue(*got, fingerprint_, geometry_.page_bytes()));
}

// A value corrupted on disk, or written by a pool of another geometry into
// the same namespace: Get returns it, its frame makes it a miss.
TEST_F(FileTierTest, CorruptedOrForeignValueIsDataLossAfterGet) {
  const TierKey key{"ns", "bitrot"};
  const std::string value = FramedPage(1, 8);
  ASSERT_OK(PutOne(*tier_, key, value));
  {
    std::fstream f(tier_->PathOf(key),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kTierValueHeaderBytes + 7);
    f.put(static_cast<char>(value[kTierValueHeaderBytes + 7] ^ 0x01));
  }
  auto got = GetOne(*tier_, key);
  ASSERT_OK(got);
  ASSERT_EQ(value.size(), got->size());
  EXPECT_NE(value, *got);
  auto page = UnframeValue(*got, fingerprint_, geometry_.page_bytes());
  EXPECT_ERROR(DataLoss, page);
  EXPECT_NE(std::string::npos, page.status().message().find("checksum"));

  PoolGeometry mla = geometry_;
  mla.attention = Attention::kMla;  // one plane: half the page bytes
  mla.num_heads = 4;                // ... and twice the heads: same size
  ASSERT_EQ(geometry_.page_bytes(), mla.page_bytes());
  const std::string foreign(geometry_.page_bytes(), 'm');
  ASSERT_OK(
      PutOne(*tier_, key, FrameValue(GeometryFingerprint(mla, 2), foreign)));
  got = GetOne(*tier_, key);
  ASSERT_OK(got);
  page = UnframeValue(*got, fingerprint_, geometry_.page_bytes());
  EXPECT_ERROR(DataLoss, page);
  EXPECT_NE(std::string::npos, page.status().message().find("geometry"));
}

// A writer that died between write and rename leaves only its temp file:
// the key has no value, and a later Put goes through.
TEST_F(FileTierTest, HalfWrittenTempFileIsNotVisible) {
  const TierKey key{"ns", "half"};
  const std::string value = FramedPage(1, 4);
  const std::string path = tier_->PathOf(key);
  const std::string dir = path.substr(0, path.rfind('/'));
  ASSERT_OK(PutOne(*tier_, {"ns", "half-other"}, value));  // makes ns dir
  ::mkdir(dir.c_str(), 0755);
  const std::string temp = dir + "/.tmp-99999-99999-0";
  {
    std::ofstream out(temp, std::ios::binary);
    out << value.substr(0, value.size() / 3);
  }
  EXPECT_ERROR(NotFound, GetOne(*tier_, key));
  EXPECT_EQ(0u, *tier_->CountPrefix({key}));
  ASSERT_OK(PutOne(*tier_, key, value));
  EXPECT_EQ(value, *GetOne(*tier_, key));
  // Our own temp files are gone after the rename; the dead one stays.
  std::vector<std::string> files;
  ListFiles(root_, &files);
  int temps = 0;
  for (const std::string& f : files) temps += f.find("/.tmp-") != f.npos;
  EXPECT_EQ(1, temps);
}

TEST_F(FileTierTest, HostileNamesStayInsideRoot) {
  const std::vector<TierKey> keys = {
      {"../../etc", "passwd"},
      {"/", "/"},
      {"..", ".."},
      {".", "."},
      {std::string("a\0b", 3), std::string("\0\0", 2)},
      {std::string("a\0c", 3), std::string("\0\0", 2)},
      {"ns", "a/../../../x"},
      {"", ""},
      {"\xff\xfe", "\n\r\t "}};
  std::vector<std::string> values;
  for (size_t i = 0; i < keys.size(); ++i)
    values.push_back("value" + std::to_string(i));
  std::vector<absl::string_view> views(values.begin(), values.end());
  for (const absl::Status& s : tier_->Put(keys, views)) EXPECT_OK(s);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(values[i], *GetOne(*tier_, keys[i])) << i;
  }
  EXPECT_EQ(keys.size(), *tier_->CountPrefix(keys));
  // Nothing was written outside root, and each key has its own file.
  std::vector<std::string> outside;
  ListFiles(parent_, &outside);
  std::set<std::string> files(outside.begin(), outside.end());
  EXPECT_EQ(keys.size(), files.size());
  for (const std::string& f : files) {
    EXPECT_EQ(0u, f.find(root_ + "/ns-")) << f;
    EXPECT_EQ(std::string::npos, f.find("..")) << f;
  }
  ASSERT_OK(tier_->Delete(keys));
  EXPECT_EQ(0u, *tier_->CountPrefix(keys));
}

TEST_F(FileTierTest, TooLongNamesAreInvalidArgument) {
  const TierKey long_key{"ns", std::string(kFileTierMaxNameBytes + 1, 'k')};
  const TierKey long_ns{std::string(kFileTierMaxNameBytes + 1, 'n'), "k"};
  EXPECT_ERROR(InvalidArgument, PutOne(*tier_, long_key, "v"));
  EXPECT_ERROR(InvalidArgument, PutOne(*tier_, long_ns, "v"));
  EXPECT_ERROR(InvalidArgument, GetOne(*tier_, long_key));
  EXPECT_ERROR(InvalidArgument, tier_->CountPrefix({long_key}));
  EXPECT_ERROR(InvalidArgument, tier_->Delete({long_ns}));
  const TierKey longest{"ns", std::string(kFileTierMaxNameBytes, 'k')};
  EXPECT_OK(PutOne(*tier_, longest, "v"));
  EXPECT_EQ("v", *GetOne(*tier_, longest));
}

TEST_F(FileTierTest, MismatchedBatchIsInvalidArgument) {
  std::vector<TierKey> keys = {{"ns", "a"}, {"ns", "b"}};
  std::vector<absl::string_view> one = {"x"};
  for (const absl::Status& s : tier_->Put(keys, one)) {
    EXPECT_ERROR(InvalidArgument, s);
  }
  EXPECT_EQ(0u, *tier_->CountPrefix(keys));
}

TEST_F(FileTierTest, ConcurrentPutsFromThreads) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string own = FramedPage(i % 4, static_cast<uint8_t>(t));
        const absl::string_view v = own;
        // Its own key, and one key every thread writes.
        std::vector<TierKey> keys = {{"ns", absl::StrCat("t", t, "-", i)},
                                     {"ns", "shared"}};
        std::vector<absl::string_view> vs = {v, v};
        for (const absl::Status& s : tier_->Put(keys, vs)) EXPECT_OK(s);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      auto got = GetOne(*tier_, {"ns", absl::StrCat("t", t, "-", i)});
      ASSERT_OK(got);
      EXPECT_EQ(FramedPage(i % 4, static_cast<uint8_t>(t)), *got);
    }
  }
  // The shared key holds one whole value, whichever came last.
  auto shared = GetOne(*tier_, {"ns", "shared"});
  ASSERT_OK(shared);
  EXPECT_OK(UnframeValue(*shared, fingerprint_, geometry_.page_bytes()));
  std::vector<std::string> files;
  ListFiles(root_, &files);
  EXPECT_EQ(static_cast<size_t>(kThreads * kPerThread + 1), files.size());
}

TEST_F(FileTierTest, OpenRefusesABadRoot) {
  EXPECT_ERROR(InvalidArgument, FileTier::Open(""));
  EXPECT_ERROR(NotFound, FileTier::Open(parent_ + "/missing"));
  const std::string file = parent_ + "/a-file";
  { std::ofstream(file) << "x"; }
  auto r = FileTier::Open(file);
  EXPECT_ERROR(FailedPrecondition, r);
  EXPECT_NE(std::string::npos, r.status().message().find("not a directory"))
      << r.status();
  EXPECT_ERROR(FailedPrecondition, FileTier::Open(file + "/below"));
  if (::geteuid() != 0) {  // root may write anywhere
    const std::string locked = parent_ + "/locked";
    ASSERT_EQ(0, ::mkdir(locked.c_str(), 0500));
    EXPECT_ERROR(FailedPrecondition, FileTier::Open(locked));
  }
}

// A root that goes away after Open: errors, not a crash.
TEST_F(FileTierTest, RootRemovedAfterOpenGivesErrors) {
  RemoveTree(root_);
  EXPECT_ERROR(Unavailable, PutOne(*tier_, {"ns", "k"}, "v"));
  EXPECT_ERROR(NotFound, GetOne(*tier_, {"ns", "k"}));
  EXPECT_EQ(0u, *tier_->CountPrefix({TierKey{"ns", "k"}}));
  EXPECT_OK(tier_->Delete({TierKey{"ns", "k"}}));
}

std::string DirOf(const std::string& path) {
  return path.substr(0, path.rfind('/'));
}

// What the tier makes is the daemon's alone, whatever the umask: a umask
// of 0 would have left 0777/0666 for others, one of 0777 nothing for us.
TEST_F(FileTierTest, DirectoriesAre0700AndFiles0600WhateverTheUmask) {
  for (const mode_t mask : {0000, 0022, 0277, 0777}) {
    SCOPED_TRACE(absl::StrFormat("umask 0%o", mask));
    const TierKey key{absl::StrFormat("umask-%o", mask), "\x12\x34"};
    const std::string value = FramedPage(mask % 4, 7);
    {
      ScopedUmask umask(mask);
      ASSERT_OK(PutOne(*tier_, key, value));
    }
    const std::string file = tier_->PathOf(key);
    EXPECT_EQ(0600, ModeOf(file));
    EXPECT_EQ(0700, ModeOf(DirOf(file)));
    EXPECT_EQ(0700, ModeOf(DirOf(DirOf(file))));
    EXPECT_EQ(value, *GetOne(*tier_, key));
  }
  // A replaced value is a new file: 0600 too.
  const TierKey key{"umask-0", "\x12\x34"};
  ASSERT_EQ(0, ::chmod(tier_->PathOf(key).c_str(), 0644));
  {
    ScopedUmask umask(0);
    ASSERT_OK(PutOne(*tier_, key, "again"));
  }
  EXPECT_EQ(0600, ModeOf(tier_->PathOf(key)));
  EXPECT_EQ("again", *GetOne(*tier_, key));
  EXPECT_EQ(0700, ModeOf(root_));  // the root is the operator's: untouched
}

// Without root's CAP_DAC_OVERRIDE, a directory made under umask 0777 (mode
// 0) could not even be opened by its maker: the tier gives it 0700 first.
// Run in a child as uid/gid 65534 when the test runs as root.
TEST(FileTierUnprivilegedTest, Umask0777WorksForAPlainUser) {
  const pid_t pid = ::fork();
  ASSERT_LE(0, pid);
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      std::_Exit(77);
    }
    char dir[] = "/tmp/file_tier_test_user.XXXXXX";
    if (::mkdtemp(dir) == nullptr) std::_Exit(3);
    int rc = 0;
    {
      ::umask(0777);
      auto tier = FileTier::Open(dir);
      if (!tier.ok()) std::_Exit(4);
      const TierKey key{"ns", "k"};
      const absl::string_view v = "value";
      if (!(*tier)->Put({key}, {v}).at(0).ok()) rc = 5;
      auto got = (*tier)->Get({key}).at(0);
      if (rc == 0 && (!got.ok() || *got != "value")) rc = 6;
      const std::string file = (*tier)->PathOf(key);
      if (rc == 0 && (ModeOf(file) != 0600 || ModeOf(DirOf(file)) != 0700 ||
                      ModeOf(DirOf(DirOf(file))) != 0700)) {
        rc = 7;
      }
    }
    RemoveTree(dir);
    std::_Exit(rc);
  }
  int status = 0;
  ASSERT_EQ(pid, ::waitpid(pid, &status, 0));
  ASSERT_TRUE(WIFEXITED(status)) << status;
  if (WEXITSTATUS(status) == 77) {
    std::printf("not run: could not become uid 65534\n");  // no GTEST_SKIP:
    return;  // ctest would mark the whole binary skipped
  }
  // 4: Open failed, 5: Put, 6: Get, 7: a mode.
  EXPECT_EQ(0, WEXITSTATUS(status));
}

TEST_F(FileTierTest, OpenRefusesARootGroupOrOthersCanWrite) {
  for (const mode_t mode : {0777, 0770, 0720, 0702, 01777, 0775}) {
    const std::string dir = absl::StrFormat("%s/open-%o", parent_, mode);
    ASSERT_EQ(0, ::mkdir(dir.c_str(), 0700));
    ASSERT_EQ(0, ::chmod(dir.c_str(), mode));
    auto r = FileTier::Open(dir);
    EXPECT_ERROR(FailedPrecondition, r);
    const std::string message(r.status().message());
    EXPECT_TRUE(absl::StrContains(
        message, absl::StrFormat("%s has mode 0%o", dir, mode)))
        << message;
    EXPECT_TRUE(absl::StrContains(message, "chmod 0700 " + dir)) << message;
    // Through a symlink to it, the same.
    const std::string link = dir + ".link";
    ASSERT_EQ(0, ::symlink(dir.c_str(), link.c_str()));
    EXPECT_ERROR(FailedPrecondition, FileTier::Open(link));
    // Fixed as the message says: opens.
    ASSERT_EQ(0, ::chmod(dir.c_str(), 0700));
    EXPECT_OK(FileTier::Open(dir));
  }
}

TEST_F(FileTierTest, OpenWarnsAboutARootOthersCanRead) {
  const std::string dir = parent_ + "/readable";
  ASSERT_EQ(0, ::mkdir(dir.c_str(), 0700));
  ASSERT_EQ(0, ::chmod(dir.c_str(), 0755));
  {
    ScopedLogCapture log;
    EXPECT_OK(FileTier::Open(dir));
    EXPECT_TRUE(absl::StrContains(log.text(), dir + " has mode 0755"))
        << log.text();
    EXPECT_TRUE(absl::StrContains(log.text(), "chmod 0700 " + dir))
        << log.text();
  }
  ASSERT_EQ(0, ::chmod(dir.c_str(), 0701));  // search only: still a warning
  {
    ScopedLogCapture log;
    EXPECT_OK(FileTier::Open(dir));
    EXPECT_TRUE(absl::StrContains(log.text(), "mode 0701")) << log.text();
  }
  ASSERT_EQ(0, ::chmod(dir.c_str(), 0700));
  {
    ScopedLogCapture log;
    EXPECT_OK(FileTier::Open(dir));
    EXPECT_EQ("", log.text());
  }
}

// The root's own name may be a symlink (the operator's choice).
TEST_F(FileTierTest, RootMayBeASymlink) {
  const std::string link = parent_ + "/root-link";
  ASSERT_EQ(0, ::symlink(root_.c_str(), link.c_str()));
  auto tier = FileTier::Open(link);
  ASSERT_OK(tier);
  EXPECT_EQ("file:" + link, (*tier)->Describe());
  const TierKey key{"ns", "via-link"};
  ASSERT_OK(PutOne(**tier, key, "v"));
  EXPECT_EQ("v", ReadFile(tier_->PathOf(key)));
  EXPECT_EQ("v", *GetOne(*tier_, key));
}

// A user who could write the root swaps a namespace's directory for a
// symlink to a directory of their choosing: nothing is read from it or
// written into it.
TEST_F(FileTierTest, NamespaceDirectorySymlinkIsNeverFollowed) {
  const TierKey a{"ns", "a"}, b{"ns", "b"};
  const std::string value = FramedPage(0, 2);
  ASSERT_OK(PutOne(*tier_, a, value));
  const std::string ns_dir = DirOf(DirOf(tier_->PathOf(a)));
  const std::string elsewhere = parent_ + "/elsewhere";
  ASSERT_EQ(0, ::rename(ns_dir.c_str(), elsewhere.c_str()));
  ASSERT_EQ(0, ::symlink(elsewhere.c_str(), ns_dir.c_str()));
  const std::string target_file = elsewhere + "/61/k-61";
  ASSERT_EQ(value, ReadFile(target_file));  // a valid value, through it

  auto got = GetOne(*tier_, a);
  EXPECT_ERROR(DataLoss, got);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "symbolic link"))
      << got.status();
  EXPECT_EQ(0u, *tier_->CountPrefix({a}));
  const absl::Status put = PutOne(*tier_, b, value);
  EXPECT_ERROR(Unavailable, put);
  EXPECT_TRUE(absl::StrContains(put.message(), "symbolic link")) << put;
  EXPECT_ERROR(DataLoss, tier_->Delete({a}));

  // The target holds what it held: one file, the same bytes.
  std::vector<std::string> files;
  ListFiles(elsewhere, &files);
  EXPECT_EQ(std::vector<std::string>{target_file}, files);
  EXPECT_EQ(value, ReadFile(target_file));
  EXPECT_EQ(-1, ModeOf(elsewhere + "/62"));
}

TEST_F(FileTierTest, FanDirectorySymlinkIsNeverFollowed) {
  const TierKey a{"ns", "a1"}, b{"ns", "a2"};  // both in fan "61"
  const std::string value = FramedPage(1, 3);
  ASSERT_OK(PutOne(*tier_, a, value));
  const std::string fan_dir = DirOf(tier_->PathOf(a));
  ASSERT_EQ(fan_dir, DirOf(tier_->PathOf(b)));
  const std::string elsewhere = parent_ + "/fan-elsewhere";
  ASSERT_EQ(0, ::rename(fan_dir.c_str(), elsewhere.c_str()));
  ASSERT_EQ(0, ::symlink(elsewhere.c_str(), fan_dir.c_str()));

  EXPECT_ERROR(DataLoss, GetOne(*tier_, a));
  EXPECT_EQ(0u, *tier_->CountPrefix({a}));
  EXPECT_ERROR(Unavailable, PutOne(*tier_, b, value));
  EXPECT_ERROR(DataLoss, tier_->Delete({a}));
  std::vector<std::string> files;
  ListFiles(elsewhere, &files);
  EXPECT_EQ(std::vector<std::string>{elsewhere + "/k-6131"}, files);
  EXPECT_EQ(value, ReadFile(elsewhere + "/k-6131"));
  // Other fans of the namespace still work.
  ASSERT_OK(PutOne(*tier_, {"ns", "z"}, value));
  EXPECT_EQ(value, *GetOne(*tier_, {"ns", "z"}));
}

// A value file that is a symlink to a valid value file elsewhere (another
// tenant's, say) is not served, not counted; a Put replaces the link, not
// what it names, and a Delete removes the link.
TEST_F(FileTierTest, ValueFileSymlinkIsNotServed) {
  const TierKey victim{"victim", "v"}, key{"ns", "k"};
  const std::string secret = FramedPage(2, 4);
  ASSERT_OK(PutOne(*tier_, victim, secret));
  ASSERT_OK(PutOne(*tier_, {"ns", "k-other"}, "x"));  // makes the fan dir
  const std::string link = tier_->PathOf(key);
  const std::string target = tier_->PathOf(victim);
  ASSERT_EQ(0, ::symlink(target.c_str(), link.c_str()));

  auto got = GetOne(*tier_, key);
  EXPECT_ERROR(DataLoss, got);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "symbolic link"))
      << got.status();
  EXPECT_EQ(0u, *tier_->CountPrefix({key}));

  ASSERT_OK(PutOne(*tier_, key, "mine"));
  EXPECT_EQ("mine", *GetOne(*tier_, key));
  EXPECT_EQ(secret, ReadFile(target));
  EXPECT_EQ(0600, ModeOf(link));  // a real file now

  ASSERT_EQ(0, ::unlink(link.c_str()));
  ASSERT_EQ(0, ::symlink(target.c_str(), link.c_str()));
  ASSERT_OK(tier_->Delete({key}));
  EXPECT_EQ(-1, ModeOf(link));
  EXPECT_EQ(secret, *GetOne(*tier_, victim));
}

// A FIFO where a value goes must not block Get (open is O_NONBLOCK).
TEST_F(FileTierTest, FifoValueIsDataLossWithoutBlocking) {
  const TierKey key{"ns", "fifo"};
  ASSERT_OK(PutOne(*tier_, {"ns", "fifo-other"}, "x"));  // same fan dir
  const std::string path = tier_->PathOf(key);
  ASSERT_EQ(0, ::mkfifo(path.c_str(), 0600));
  auto result = std::async(std::launch::async,
                           [&] { return GetOne(*tier_, key).status(); });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    // Unblock the reader, so that the test ends.
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
    FAIL() << "Get blocked on a FIFO";
  }
  EXPECT_ERROR(DataLoss, result.get());
  EXPECT_EQ(0u, *tier_->CountPrefix({key}));
}

}  // namespace
}  // namespace hostkv
