#include "server/sessions/descriptor_closer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "proto/contract/session_socket.h"

namespace hostkv {
namespace {

// A loopback TCP connection whose client end lingers `seconds` on close,
// its send buffer full of data the accepted end never reads.
struct LingeringSocket {
  ScopedFd listener, accepted, client;
};

LingeringSocket Lingering(int seconds) {
  LingeringSocket s;
  s.listener = ScopedFd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  s.client = ScopedFd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(0, bind(s.listener.get(), reinterpret_cast<sockaddr*>(&addr), len));
  EXPECT_EQ(0, listen(s.listener.get(), 1));
  EXPECT_EQ(0, getsockname(s.listener.get(), reinterpret_cast<sockaddr*>(&addr),
                           &len));
  EXPECT_EQ(0,
            connect(s.client.get(), reinterpret_cast<sockaddr*>(&addr), len));
  s.accepted =
      ScopedFd(accept4(s.listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  const linger lingering{1, seconds};
  setsockopt(s.client.get(), SOL_SOCKET, SO_LINGER, &lingering,
             sizeof(lingering));
  fcntl(s.client.get(), F_SETFL, O_NONBLOCK);
  static char chunk[65536];
  while (send(s.client.get(), chunk, sizeof(chunk), MSG_NOSIGNAL) > 0) {
  }
  return s;
}

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) >= 0; }

// Waits up to 10 s for the closer's queue to empty.
bool Drained(const DescriptorCloser& closer) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (closer.pending() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  return closer.pending() == 0;
}

TEST(KindOfDescriptorTest, NamesWhatClientsPass) {
  ScopedFd memfd(memfd_create("kind", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_EQ(DescriptorKind::kMemfd, KindOfDescriptor(memfd.get()));
  EXPECT_EQ("memfd", DescribeDescriptor(memfd.get()));
  ScopedFd tcp(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_EQ(DescriptorKind::kInetSocket, KindOfDescriptor(tcp.get()));
  EXPECT_EQ("socket (AF_INET, SOCK_STREAM)", DescribeDescriptor(tcp.get()));
  ScopedFd udp6(socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (udp6.get() >= 0) {
    EXPECT_EQ(DescriptorKind::kInetSocket, KindOfDescriptor(udp6.get()));
  }
  int pair[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair));
  ScopedFd left(pair[0]), right(pair[1]);
  EXPECT_EQ(DescriptorKind::kOtherSocket, KindOfDescriptor(left.get()));
  EXPECT_EQ("socket (AF_UNIX, SOCK_SEQPACKET)", DescribeDescriptor(left.get()));
  int pipe_fds[2];
  ASSERT_EQ(0, pipe2(pipe_fds, O_CLOEXEC));
  ScopedFd pipe_read(pipe_fds[0]), pipe_write(pipe_fds[1]);
  EXPECT_EQ(DescriptorKind::kPipe, KindOfDescriptor(pipe_read.get()));
  ScopedFd null_file(open("/dev/null", O_RDONLY | O_CLOEXEC));
  EXPECT_EQ(DescriptorKind::kOther, KindOfDescriptor(null_file.get()));
  ScopedFd path_only(open("/", O_PATH | O_CLOEXEC));
  EXPECT_EQ(DescriptorKind::kOther, KindOfDescriptor(path_only.get()));
}

constexpr uid_t kUid = 1000;
constexpr uid_t kOtherUid = 1001;

// Waits up to 10 s for `done`.
template <typename Done>
bool WaitFor(Done done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!done() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

ScopedFd DevNull() { return ScopedFd(open("/dev/null", O_RDONLY | O_CLOEXEC)); }

// The final close of a socket lingering on unsent data does not wait: the
// uid's thread makes it abortive and closes it at once; the caller does
// not touch it (SO_LINGER takes the socket's lock).
TEST(DescriptorCloserTest, LingeringTcpSocketIsClosedAtOnce) {
  DescriptorCloser closer;
  LingeringSocket s = Lingering(5);
  const int fd = s.client.get();
  const absl::Time start = absl::Now();
  closer.Dispose(kUid, std::move(s.client));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
  ASSERT_TRUE(Drained(closer));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_FALSE(IsOpen(fd));
  EXPECT_EQ(0u, closer.pending());
}

TEST(DescriptorCloserTest, MemfdsCloseHereOthersOnTheThread) {
  DescriptorCloser closer;
  ScopedFd memfd(memfd_create("closer", MFD_CLOEXEC));
  const int memfd_number = memfd.get();
  closer.Dispose(kUid, std::move(memfd));
  EXPECT_FALSE(IsOpen(memfd_number));
  int pair[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair));
  ScopedFd kept(pair[1]);
  closer.Dispose(kUid, ScopedFd(pair[0]));
  closer.Dispose(kUid, DevNull());
  ASSERT_TRUE(Drained(closer));
  char byte;
  EXPECT_EQ(0, read(kept.get(), &byte, 1));  // the other end was closed
  EXPECT_EQ(0u, closer.leaked());
}

// A Unix socket whose queue holds the only reference to `held`: closing it
// releases `held` in the closing thread (which then waits out its linger).
ScopedFd HoldingOnly(ScopedFd held) {
  int pair[2];
  EXPECT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair));
  ScopedFd holder(pair[0]), sender(pair[1]);
  EXPECT_TRUE(SendRecord(sender.get(), "x", 1, held.get()));
  return holder;
}

// A close that blocks holds up only the thread of the uid who passed it:
// that uid fills up to its limit and is refused (what it still passes is
// left open, counted, never closed by the caller), while another uid's
// descriptors are closed at once.
TEST(DescriptorCloserTest, AStuckUidFillsUpItsOwnShareOnly) {
  DescriptorCloser closer({/*max_per_uid=*/2, /*max_total=*/16});
  // Its close blocks kUid's thread ~3 s.
  LingeringSocket s = Lingering(3);
  ScopedFd holder = HoldingOnly(std::move(s.client));
  ASSERT_TRUE(closer.Enqueue(kUid, &holder));
  absl::SleepFor(absl::Milliseconds(100));
  ScopedFd second = DevNull();
  ASSERT_TRUE(closer.Enqueue(kUid, &second));
  EXPECT_EQ(0u, closer.Headroom(kUid));
  ScopedFd third = DevNull();
  EXPECT_FALSE(closer.Enqueue(kUid, &third));
  EXPECT_GE(third.get(), 0);  // still the caller's
  const int leaked = third.get();
  const absl::Time start = absl::Now();
  closer.Dispose(kUid, std::move(third));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_EQ(1u, closer.leaked());
  EXPECT_TRUE(IsOpen(leaked));
  close(leaked);
  // Another uid: its own thread, its own share.
  EXPECT_EQ(2u, closer.Headroom(kOtherUid));
  ScopedFd theirs = DevNull();
  const int theirs_number = theirs.get();
  ASSERT_TRUE(closer.Enqueue(kOtherUid, &theirs));
  ASSERT_TRUE(WaitFor([&] { return closer.pending(kOtherUid) == 0; }));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));  // kUid's still waits
  EXPECT_EQ(2u, closer.pending(kUid));
  EXPECT_FALSE(IsOpen(theirs_number));
  EXPECT_TRUE(Drained(closer));
  EXPECT_EQ(2u, closer.Headroom(kUid));
}

// All uids together stay within max_total.
TEST(DescriptorCloserTest, AllUidsTogetherStayWithinTheTotal) {
  DescriptorCloser closer({/*max_per_uid=*/2, /*max_total=*/3});
  LingeringSocket a = Lingering(2), b = Lingering(2);
  ScopedFd holder_a = HoldingOnly(std::move(a.client));
  ScopedFd holder_b = HoldingOnly(std::move(b.client));
  ASSERT_TRUE(closer.Enqueue(kUid, &holder_a));
  ASSERT_TRUE(closer.Enqueue(kOtherUid, &holder_b));
  absl::SleepFor(absl::Milliseconds(100));
  ScopedFd one = DevNull();
  ASSERT_TRUE(closer.Enqueue(kUid, &one));
  EXPECT_EQ(0u, closer.Headroom(kOtherUid));
  ScopedFd two = DevNull();
  EXPECT_FALSE(closer.Enqueue(kOtherUid, &two));
  EXPECT_EQ(3u, closer.pending());
  EXPECT_TRUE(Drained(closer));
}

// A connection whose unread records hold a lingering socket (behind an
// empty record) is emptied on the uid's thread before it is closed: each
// descriptor is reset as it comes, nothing is released in the caller, and
// it counts in connections() until it is closed. After the shutdown the
// peer cannot queue more.
TEST(DescriptorCloserTest, ConnectionIsDrainedOnTheUidsThread) {
  DescriptorCloser closer;
  int pair[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair));
  ScopedFd ours(pair[0]), theirs(pair[1]);
  const int one = 1;
  ASSERT_EQ(0,
            setsockopt(ours.get(), SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)));
  LingeringSocket s = Lingering(3);
  ASSERT_EQ(0, send(theirs.get(), "", 0, 0));
  ASSERT_TRUE(SendRecord(theirs.get(), "x", 1, s.client.get()));
  s.client = ScopedFd();  // the only reference is in flight
  const absl::Time start = absl::Now();
  closer.CloseConnection(kUid, std::move(ours));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
  ASSERT_TRUE(WaitFor([&] { return closer.connections(kUid) == 0; }));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(0u, closer.pending());  // connections are not descriptors
  EXPECT_EQ(-1, send(theirs.get(), "y", 1, MSG_NOSIGNAL | MSG_DONTWAIT));
  EXPECT_EQ(EPIPE, errno);
  // The lingering socket was reset, not left to linger.
  std::vector<char> buffer(1 << 16);
  fcntl(s.accepted.get(), F_SETFL, O_NONBLOCK);
  while (read(s.accepted.get(), buffer.data(), buffer.size()) > 0) {
  }
  EXPECT_EQ(ECONNRESET, errno);
}

// The destructor does not wait for ever on a close that does not return.
TEST(DescriptorCloserTest, DestructorGivesUpOnAStuckClose) {
  // Its close blocks for 6 s.
  LingeringSocket s = Lingering(6);
  ScopedFd holder = HoldingOnly(std::move(s.client));
  auto closer = std::make_unique<DescriptorCloser>();
  ASSERT_TRUE(closer->Enqueue(kUid, &holder));
  const absl::Time start = absl::Now();
  closer.reset();
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, DescriptorCloser::kShutdownWait - absl::Milliseconds(100));
  EXPECT_LT(took, DescriptorCloser::kShutdownWait + absl::Seconds(2));
}

}  // namespace
}  // namespace hostkv
