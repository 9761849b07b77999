// The multi-user suite (tenants_fixture.h): descriptors a user passes over
// the session socket. The daemon takes one memfd with a kPassFd record and
// nothing else, and no descriptor it refuses can stall the session monitor
// (issue 25, finding 6).
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/e2e/tenants_fixture.h"

namespace hostkv {
namespace {

constexpr int kInvalidArgument =
    static_cast<int>(absl::StatusCode::kInvalidArgument);

// Reads one line of `t`'s output within `within`; "" on timeout or EOF.
// Reads the pipe itself (no stdio buffer), so poll sees all that is left.
std::string ReadLineWithin(Tenant& t, absl::Duration within) {
  const absl::Time deadline = absl::Now() + within;
  std::string line;
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd p{fileno(t.out), POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) != 1) return "";
    char c;
    if (read(fileno(t.out), &c, 1) != 1) return "";
    if (c == '\n') return line;
    line += c;
  }
}

int Occurrences(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos;
       at = text.find(part, at + 1)) {
    ++n;
  }
  return n;
}

// Kills the tenant when the test ends, however it ends.
struct KillAtEnd {
  Tenant& tenant;
  ~KillAtEnd() {
    kill(tenant.pid, SIGKILL);
    tenant.Wait();
  }
};

SessionMessage Record(SessionMessageKind kind) {
  return NewSessionMessage(kind, "descriptors-test");
}

// A session-socket connection of this process whose replies must come
// within 3 s.
class SessionConnection {
 public:
  explicit SessionConnection(const std::string& socket_path)
      : fd_(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)) {
    const std::string path = socket_path + kSessionSocketSuffix;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    const timeval patience{3, 0};
    setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
    connected_ = connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr),
                         sizeof(addr)) == 0;
  }

  // Sends `m` with `fds` and returns the reply's code, -1 if none came.
  int Exchange(const SessionMessage& m, const std::vector<int>& fds = {},
               SessionReply* reply_out = nullptr) {
    if (!connected_) return -1;
    iovec iov{const_cast<SessionMessage*>(&m), sizeof(m)};
    std::vector<char> control(CMSG_SPACE(fds.size() * sizeof(int)));
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!fds.empty()) {
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
      std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
    }
    if (sendmsg(fd_.get(), &msg, MSG_NOSIGNAL) != sizeof(m)) return -1;
    SessionReply reply{};
    ReceivedRecord got = ReceiveRecord(fd_.get(), &reply, sizeof(reply), false);
    if (got.bytes != sizeof(reply)) return -1;
    reply.message[sizeof(reply.message) - 1] = '\0';
    if (reply_out != nullptr) *reply_out = reply;
    return static_cast<int>(reply.code);
  }

 private:
  ScopedFd fd_;
  bool connected_ = false;
};

// Whether the kernel can refuse descriptors for a socket (SO_PASSRIGHTS,
// Linux 6.16), as the session socket then does before a session.
bool KernelRefusesDescriptors() {
  ScopedFd probe(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  const int zero = 0;
  return setsockopt(probe.get(), SOL_SOCKET, 83, &zero, sizeof(zero)) == 0;
}

// A memfd of `bytes`, sealed against shrinking, as clients pass them.
ScopedFd SealedMemfd(size_t bytes, unsigned flags = 0) {
  ScopedFd fd(memfd_create("descriptors-test",
                           MFD_CLOEXEC | MFD_ALLOW_SEALING | flags));
  if (fd.get() < 0 || ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    return ScopedFd();
  }
  return fd;
}

// Alice passes TCP sockets that linger 600 s on unsent data, with kPassFd
// and kOpen records on a connection with a session, and with a kOpen record
// on a fresh one, and closes her copies (tenant_client pass-lingering).
// Every such record is refused (the fresh connection's by the kernel where
// it has SO_PASSRIGHTS: no descriptor reaches the daemon before a session),
// and while she holds the other ends root and bob still open and attach
// sessions at once: the monitor waits on none of her closes. Before the fix
// of issue 25 it blocked in the first: everyone's records, hers included,
// waited (or, where the daemon's close came first, alice's own close
// lingered).
TEST_F(TenantsTest, LingeringSocketsPassedDoNotWedgeTheSessionMonitor) {
  Tenant alice = Start(kAlice, {"pass-lingering", "60000"});
  KillAtEnd kill_alice{alice};
  std::vector<std::string> lines;
  while (lines.empty() || lines.back() != "holding") {
    std::string line = ReadLineWithin(alice, absl::Seconds(5));
    if (line.empty()) break;
    lines.push_back(std::move(line));
  }
  EXPECT_EQ("holding", lines.empty() ? "" : lines.back())
      << "alice is stuck after: " << absl::StrJoin(lines, " | ");
  const std::string all = absl::StrJoin(lines, "\n");
  const std::string socket_refused = absl::StrCat(
      ": code ", kInvalidArgument,
      " a kOpen record carries no descriptor; got a socket (AF_INET, "
      "SOCK_STREAM)\n");
  EXPECT_NE(std::string::npos, all.find("open: code 0 \n")) << all;
  EXPECT_NE(std::string::npos,
            all.find(absl::StrCat("kPassFd: code ", kInvalidArgument,
                                  " kPassFd takes a memfd (memfd_create with "
                                  "MFD_ALLOW_SEALING); got a socket (AF_INET, "
                                  "SOCK_STREAM)\n")))
      << all;
  EXPECT_NE(std::string::npos, all.find("\nkOpen" + socket_refused)) << all;
  const bool kernel_refuses = KernelRefusesDescriptors();
  if (kernel_refuses) {
    EXPECT_NE(std::string::npos,
              all.find("fresh kOpen sent: Operation not permitted"))
        << all;
  } else {
    EXPECT_NE(std::string::npos, all.find("\nfresh kOpen" + socket_refused))
        << all;
  }

  // Alice still holds her listeners and the accepted ends.
  const absl::Time start = absl::Now();
  SessionConnection opened(daemon_->socket_path());
  EXPECT_EQ(0, opened.Exchange(Record(SessionMessageKind::kOpen)));
  auto channel = grpc::CreateChannel(daemon_->target(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::HostKV::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(3));
  v1::OpenSessionResponse unattached;
  ASSERT_TRUE(
      stub->OpenSession(&context, v1::OpenSessionRequest(), &unattached).ok());
  SessionMessage attach = Record(SessionMessageKind::kAttach);
  ASSERT_EQ(kSessionIdBytes, unattached.session_id().size());
  std::memcpy(attach.session_id, unattached.session_id().data(),
              kSessionIdBytes);
  SessionConnection attached(daemon_->socket_path());
  EXPECT_EQ(0, attached.Exchange(attach));
  Tenant bob = Start(kBob, {"open-sessions", "1", "0"});
  KillAtEnd kill_bob{bob};
  EXPECT_EQ("opened 1 code 0 ", ReadLineWithin(bob, absl::Seconds(3)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));

  // One warning per connection that passed one (two, or one where the
  // kernel refused the fresh connection's), with the uid and what was
  // passed.
  const std::string log = daemon_->log();
  EXPECT_NE(std::string::npos,
            log.find("uid 61001 passed 1 descriptor(s) with a kPassFd record, "
                     "refused: socket (AF_INET, SOCK_STREAM)"))
      << log;
  if (!kernel_refuses) {
    EXPECT_NE(std::string::npos,
              log.find("uid 61001 passed 1 descriptor(s) with a kOpen record"))
        << log;
  }
  EXPECT_EQ(kernel_refuses ? 1 : 2, Occurrences(log, "uid 61001 passed"))
      << log;
}

// Only one sealed memfd with kPassFd is taken (hugetlbfs ones too); pipes,
// sockets, extra descriptors and descriptors on other records are refused
// with InvalidArgument, and the connection goes on working.
TEST_F(TenantsTest, OnlyOneMemfdIsTakenWithKPassFd) {
  SessionConnection c(daemon_->socket_path());
  ASSERT_EQ(0, c.Exchange(Record(SessionMessageKind::kOpen)));
  ScopedFd memfd = SealedMemfd(1 << 20);
  ASSERT_GE(memfd.get(), 0);
  int pipe_fds[2];
  ASSERT_EQ(0, pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK));
  ScopedFd pipe_read(pipe_fds[0]), pipe_write(pipe_fds[1]);
  int pair[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair));
  ScopedFd left(pair[0]), right(pair[1]);
  ScopedFd null_file(open("/dev/null", O_RDONLY | O_CLOEXEC));

  const SessionMessage pass = Record(SessionMessageKind::kPassFd);
  SessionReply reply{};
  EXPECT_EQ(kInvalidArgument, c.Exchange(pass, {pipe_write.get()}, &reply));
  EXPECT_STREQ(
      "kPassFd takes a memfd (memfd_create with MFD_ALLOW_SEALING); "
      "got a pipe",
      reply.message);
  EXPECT_EQ(kInvalidArgument, c.Exchange(pass, {left.get()}, &reply));
  EXPECT_STREQ(
      "kPassFd takes a memfd (memfd_create with MFD_ALLOW_SEALING); "
      "got a socket (AF_UNIX, SOCK_STREAM)",
      reply.message);
  EXPECT_EQ(kInvalidArgument, c.Exchange(pass, {null_file.get()}, &reply));
  EXPECT_EQ(kInvalidArgument,
            c.Exchange(pass, {memfd.get(), memfd.get()}, &reply));
  EXPECT_STREQ("kPassFd takes exactly one descriptor, a memfd; got 2",
               reply.message);
  EXPECT_EQ(kInvalidArgument,
            c.Exchange(Record(SessionMessageKind::kFetchPoolSegment),
                       {memfd.get()}, &reply));
  EXPECT_EQ(0, c.Exchange(pass, {memfd.get()}, &reply)) << reply.message;
  EXPECT_EQ(1u, reply.value);
  // A hugetlbfs memfd, where the host has huge pages to back one.
  ScopedFd huge = SealedMemfd(2 << 20, MFD_HUGETLB);
  if (huge.get() >= 0) {
    EXPECT_EQ(0, c.Exchange(pass, {huge.get()}, &reply)) << reply.message;
  }
  // The refused descriptors are closed, on the closer thread of our uid
  // (not inline): with ours gone too, the pipe's read end sees EOF within
  // a moment (EAGAIN while the daemon still holds the write end).
  pipe_write = ScopedFd();
  char byte;
  ssize_t got = -1;
  for (int i = 0; i < 500 && got != 0; ++i) {
    got = read(pipe_read.get(), &byte, 1);
    if (got != 0) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(0, got) << "the daemon still holds the refused pipe after 5 s";
  // Five refusals on one connection, one warning.
  EXPECT_EQ(1, Occurrences(daemon_->log(), "uid 0 passed")) << daemon_->log();
}

}  // namespace
}  // namespace hostkv
