#include "server/operations/instance_lock.h"

#include <stdlib.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fcntl.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr uid_t kOtherUid = 12345;

// A fresh mkdtemp directory (0700, ours) per test, removed afterwards.
class InstanceLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hostkv-lock-test-XXXXXX";
    ASSERT_NE(nullptr, mkdtemp(tmpl));
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  // Makes directory `name` with exactly `mode` (no umask).
  std::string MakeDir(const std::string& name, mode_t mode) const {
    const std::string path = Path(name);
    EXPECT_EQ(0, mkdir(path.c_str(), 0700));
    EXPECT_EQ(0, chmod(path.c_str(), mode));
    return path;
  }
  void WriteFile(const std::string& path, const std::string& text,
                 mode_t mode) const {
    std::ofstream(path) << text;
    ASSERT_EQ(0, chmod(path.c_str(), mode));
  }
  static std::string ReadFile(const std::string& path) {
    std::ostringstream text;
    text << std::ifstream(path).rdbuf();
    return text.str();
  }
  static mode_t ModeOf(const std::string& path) {
    struct stat st;
    EXPECT_EQ(0, stat(path.c_str(), &st));
    return st.st_mode & 07777;
  }
  // Binds a Unix socket at `path`; returns its fd.
  static int BindSocket(const std::string& path) {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(0, bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
    return fd;
  }
  static void SkipUnlessRoot() {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to chown to another uid";
  }

  std::string dir_;
};

TEST_F(InstanceLockTest, CreatesMissingDirectoriesAndLocksOnce) {
  const std::string sock = Path("a/b/x.sock");
  absl::StatusOr<InstanceLock> lock = InstanceLock::Acquire(sock);
  ASSERT_OK(lock);
  EXPECT_EQ(0750u, ModeOf(Path("a/b")));
  EXPECT_EQ(0600u, ModeOf(sock + ".lock"));
  absl::StatusOr<InstanceLock> second = InstanceLock::Acquire(sock);
  EXPECT_ERROR(FailedPrecondition, second);
  EXPECT_NE(std::string::npos,
            second.status().message().find("another hostkvd already serves"));
}

TEST_F(InstanceLockTest, ReleasingRemovesTheLockFileAndTheNextDaemonLocks) {
  const std::string sock = Path("x.sock");
  {
    absl::StatusOr<InstanceLock> lock = InstanceLock::Acquire(sock);
    ASSERT_OK(lock);
    EXPECT_TRUE(std::filesystem::exists(sock + ".lock"));
  }
  EXPECT_FALSE(std::filesystem::exists(sock + ".lock"));  // a clean exit
  absl::StatusOr<InstanceLock> next = InstanceLock::Acquire(sock);
  ASSERT_OK(next);
  EXPECT_ERROR(FailedPrecondition, InstanceLock::Acquire(sock));
}

TEST_F(InstanceLockTest, LockOnARemovedFileIsNotALock) {
  // A daemon that opened the lock file just before its holder removed it
  // and unlocked must not serve beside the next one.
  const std::string sock = Path("x.sock");
  const int stale = open((sock + ".lock").c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(stale, 0);
  ASSERT_EQ(0, unlink((sock + ".lock").c_str()));
  ASSERT_EQ(0, flock(stale, LOCK_EX | LOCK_NB));  // held on the removed file
  absl::StatusOr<InstanceLock> lock = InstanceLock::Acquire(sock);
  EXPECT_OK(lock);  // the path's new file is the lock
  EXPECT_ERROR(FailedPrecondition, InstanceLock::Acquire(sock));
  close(stale);
}

TEST_F(InstanceLockTest, MkdtempDirectoryIsAccepted) {
  EXPECT_OK(InstanceLock::Acquire(Path("x.sock")));  // 0700, ours
}

TEST_F(InstanceLockTest, SymlinkAsLockFileIsRefusedAndTargetUntouched) {
  const std::string target = Path("victim");
  WriteFile(target, "precious", 0644);
  ASSERT_EQ(0, symlink(target.c_str(), Path("x.sock.lock").c_str()));
  absl::StatusOr<InstanceLock> lock = InstanceLock::Acquire(Path("x.sock"));
  EXPECT_ERROR(FailedPrecondition, lock);
  EXPECT_NE(std::string::npos, lock.status().message().find("symbolic link"));
  EXPECT_EQ("precious", ReadFile(target));
  EXPECT_EQ(0644u, ModeOf(target));
}

TEST_F(InstanceLockTest, DanglingSymlinkAsLockFileCreatesNothing) {
  const std::string target = Path("would-be-created");
  ASSERT_EQ(0, symlink(target.c_str(), Path("x.sock.lock").c_str()));
  EXPECT_ERROR(FailedPrecondition, InstanceLock::Acquire(Path("x.sock")));
  EXPECT_FALSE(std::filesystem::exists(target));
}

TEST_F(InstanceLockTest, LockFileOfAnotherUserIsRefused) {
  SkipUnlessRoot();
  const std::string lock_path = Path("x.sock.lock");
  WriteFile(lock_path, "", 0600);
  ASSERT_EQ(0, chown(lock_path.c_str(), kOtherUid, kOtherUid));
  absl::StatusOr<InstanceLock> lock = InstanceLock::Acquire(Path("x.sock"));
  EXPECT_ERROR(FailedPrecondition, lock);
  EXPECT_NE(std::string::npos, lock.status().message().find("uid 12345"));
}

TEST_F(InstanceLockTest, LockPathThatIsNotARegularFileIsRefused) {
  MakeDir("x.sock.lock", 0700);
  EXPECT_ERROR(FailedPrecondition, InstanceLock::Acquire(Path("x.sock")));
}

TEST_F(InstanceLockTest, DirectoryOfAnotherUserIsRefused) {
  SkipUnlessRoot();
  const std::string dir = MakeDir("theirs", 0755);
  ASSERT_EQ(0, chown(dir.c_str(), kOtherUid, kOtherUid));
  absl::StatusOr<InstanceLock> lock = InstanceLock::Acquire(dir + "/x.sock");
  EXPECT_ERROR(FailedPrecondition, lock);
  EXPECT_NE(std::string::npos, lock.status().message().find("owned by uid 12345"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/x.sock.lock"));
}

TEST_F(InstanceLockTest, GroupOrOtherWritableDirectoryWithoutStickyIsRefused) {
  for (const mode_t mode : {0770, 0757, 0777, 02777}) {
    const std::string dir = MakeDir(absl::StrCat("w", mode), mode);
    absl::StatusOr<InstanceLock> lock = InstanceLock::Acquire(dir + "/x.sock");
    EXPECT_ERROR(FailedPrecondition, lock);
    EXPECT_NE(std::string::npos, lock.status().message().find("chmod go-w"))
        << lock.status();
    EXPECT_FALSE(std::filesystem::exists(dir + "/x.sock.lock")) << mode;
  }
}

TEST_F(InstanceLockTest, StickyWorldWritableDirectoryIsAccepted) {
  const std::string dir = MakeDir("tmp-like", 01777);
  EXPECT_OK(InstanceLock::Acquire(dir + "/x.sock"));
  // /tmp itself (root's, 01777).
  const std::string in_tmp = dir_ + ".sock";
  EXPECT_OK(InstanceLock::Acquire(in_tmp));
  unlink((in_tmp + ".lock").c_str());
}

TEST_F(InstanceLockTest, SymlinkedDirectoryIsRefusedInEverySpelling) {
  const std::string real = MakeDir("real", 0700);
  ASSERT_EQ(0, symlink(real.c_str(), Path("link").c_str()));
  for (const std::string sock : {Path("link/x.sock"), Path("link/./x.sock"),
                                 Path("link//x.sock")}) {
    absl::StatusOr<InstanceLock> lock = InstanceLock::Acquire(sock);
    EXPECT_ERROR(FailedPrecondition, lock);
    EXPECT_NE(std::string::npos, lock.status().message().find("symbolic link"))
        << lock.status();
  }
  EXPECT_FALSE(std::filesystem::exists(real + "/x.sock.lock"));
}

TEST_F(InstanceLockTest, SecureSocketPathSetsModeOfTheBoundSocket) {
  const std::string sock = Path("s.sock");
  const int fd = BindSocket(sock);
  EXPECT_OK(SecureSocketPath(sock, 0660, static_cast<gid_t>(-1)));
  EXPECT_EQ(0660u, ModeOf(sock));
  EXPECT_OK(SecureSocketPath(sock, 0600, getegid()));
  EXPECT_EQ(0600u, ModeOf(sock));
  close(fd);
}

TEST_F(InstanceLockTest, SecureSocketPathRefusesSymlinkAndLeavesTarget) {
  const std::string target = Path("victim");
  WriteFile(target, "precious", 0600);
  const std::string sock = Path("s.sock");
  ASSERT_EQ(0, symlink(target.c_str(), sock.c_str()));
  absl::Status s = SecureSocketPath(sock, 0666, static_cast<gid_t>(-1));
  EXPECT_ERROR(FailedPrecondition, s);
  EXPECT_NE(std::string::npos, s.message().find("symbolic link"));
  EXPECT_EQ(0600u, ModeOf(target));

  // A symlink to a real socket is refused too: the link is not what we bound.
  const std::string other = Path("other.sock");
  const int fd = BindSocket(other);
  ASSERT_EQ(0, chmod(other.c_str(), 0600));
  ASSERT_EQ(0, symlink(other.c_str(), Path("l2.sock").c_str()));
  EXPECT_ERROR(FailedPrecondition, SecureSocketPath(Path("l2.sock"), 0666, -1));
  EXPECT_EQ(0600u, ModeOf(other));
  close(fd);
}

TEST_F(InstanceLockTest, SecureSocketPathRefusesAFileAndAForeignSocket) {
  WriteFile(Path("plain"), "", 0600);
  EXPECT_ERROR(FailedPrecondition, SecureSocketPath(Path("plain"), 0666, -1));
  EXPECT_EQ(0600u, ModeOf(Path("plain")));
  EXPECT_ERROR(FailedPrecondition, SecureSocketPath(Path("missing"), 0666, -1));
  if (geteuid() == 0) {
    const std::string sock = Path("theirs.sock");
    const int fd = BindSocket(sock);
    ASSERT_EQ(0, chmod(sock.c_str(), 0600));
    ASSERT_EQ(0, lchown(sock.c_str(), kOtherUid, kOtherUid));
    EXPECT_ERROR(FailedPrecondition, SecureSocketPath(sock, 0666, -1));
    EXPECT_EQ(0600u, ModeOf(sock));
    close(fd);
  }
}

TEST_F(InstanceLockTest, SegmentPrefixIsKeyedByTheRealPath) {
  MakeDir("dir", 0700);
  char* real = realpath(dir_.c_str(), nullptr);
  ASSERT_NE(nullptr, real);
  const std::string abs = std::string(real) + "/dir/x.sock";
  free(real);
  char cwd[PATH_MAX];
  ASSERT_NE(nullptr, getcwd(cwd, sizeof(cwd)));
  ASSERT_EQ(0, chdir(dir_.c_str()));
  const std::string dotted = SegmentPrefix("dir/./x.sock");
  const std::string relative = SegmentPrefix("./dir/x.sock");
  const std::string doubled = SegmentPrefix("dir//x.sock");
  ASSERT_EQ(0, chdir("dir"));
  const std::string bare = SegmentPrefix("x.sock");
  ASSERT_EQ(0, chdir(cwd));
  EXPECT_EQ(SegmentPrefix(abs), dotted);
  EXPECT_EQ(SegmentPrefix(abs), relative);
  EXPECT_EQ(SegmentPrefix(abs), doubled);
  EXPECT_EQ(SegmentPrefix(abs), bare);
  EXPECT_EQ(SegmentPrefix(dir_ + "/dir/../dir/x.sock"), SegmentPrefix(abs));
  EXPECT_NE(SegmentPrefix(abs), SegmentPrefix(dir_ + "/dir/y.sock"));
  EXPECT_EQ(0u, SegmentPrefix(abs).rfind("/hostkv.", 0));
}

TEST(SegmentPrefixTest, TcpDaemonsUseTheirPid) {
  EXPECT_EQ(absl::StrCat("/hostkv.p", getpid(), "."), SegmentPrefix(""));
}

}  // namespace
}  // namespace hostkv
