#include "server/sessions/descriptor_closer.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/contract/session_socket.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

bool SocketOption(int fd, int option, int* value) {
  socklen_t len = sizeof(*value);
  return getsockopt(fd, SOL_SOCKET, option, value, &len) == 0;
}

std::string FamilyName(int family) {
  switch (family) {
    case AF_UNIX:
      return "AF_UNIX";
    case AF_INET:
      return "AF_INET";
    case AF_INET6:
      return "AF_INET6";
    case AF_NETLINK:
      return "AF_NETLINK";
    case AF_PACKET:
      return "AF_PACKET";
    default:
      return absl::StrCat("family ", family);
  }
}

std::string TypeName(int type) {
  switch (type) {
    case SOCK_STREAM:
      return "SOCK_STREAM";
    case SOCK_DGRAM:
      return "SOCK_DGRAM";
    case SOCK_SEQPACKET:
      return "SOCK_SEQPACKET";
    case SOCK_RAW:
      return "SOCK_RAW";
    default:
      return absl::StrCat("type ", type);
  }
}

}  // namespace

DescriptorKind KindOfDescriptor(int fd) {
  // EINVAL for anything that is not a shmem or hugetlbfs file.
  if (fcntl(fd, F_GET_SEALS) >= 0) return DescriptorKind::kMemfd;
  int type = 0;
  if (SocketOption(fd, SO_TYPE, &type)) {
    int family = -1;
    SocketOption(fd, SO_DOMAIN, &family);
    return family == AF_INET || family == AF_INET6
               ? DescriptorKind::kInetSocket
               : DescriptorKind::kOtherSocket;
  }
  // Not F_GETPIPE_SZ: it takes the pipe's mutex, which a writer blocked in
  // a page fault (a FUSE- or userfaultfd-backed buffer) can hold. The link
  // of /proc/self/fd/N is the file's path, built from its dentry alone.
  char link[64] = {};
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
  if (n > 0 && std::strncmp(link, "pipe:[", 6) == 0) return DescriptorKind::kPipe;
  return DescriptorKind::kOther;
}

std::string DescribeDescriptor(int fd) {
  switch (KindOfDescriptor(fd)) {
    case DescriptorKind::kMemfd:
      return "memfd";
    case DescriptorKind::kInetSocket:
    case DescriptorKind::kOtherSocket: {
      int family = -1, type = -1;
      SocketOption(fd, SO_DOMAIN, &family);
      SocketOption(fd, SO_TYPE, &type);
      return absl::StrCat("socket (", FamilyName(family), ", ", TypeName(type),
                          ")");
    }
    case DescriptorKind::kPipe:
      return "pipe";
    case DescriptorKind::kOther:
      break;
  }
  return "descriptor that is not a memfd, socket or pipe";
}

namespace {

// Closes `fd` on this thread: abortively if it is a TCP socket (SO_LINGER
// {1, 0}: a reset, no wait for unsent data, no orphan; harmless on other
// sockets). May block for as long as the client who passed it likes.
void CloseNow(int fd) {
  if (KindOfDescriptor(fd) == DescriptorKind::kInetSocket) {
    const linger abortive{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &abortive, sizeof(abortive));
  }
  close(fd);
}

// Closes session connection `connection`: once it is shut for reading no
// record can join its queue (the kernel tests for that and queues under
// the lock shutdown takes), so receiving until it is empty, closing each
// descriptor as it comes (at most one record's at a time in the table),
// leaves nothing for its close to release but what did not come out.
void CloseConnectionNow(int connection) {
  // The sender's socket buffer keeps the queue to a few hundred records.
  constexpr int kMaxDrainedRecords = 4096;
  if (shutdown(connection, SHUT_RD) == 0) {
    for (int i = 0; i < kMaxDrainedRecords; ++i) {
      SessionMessage record;
      ReceivedRecord got =
          ReceiveRecord(connection, &record, sizeof(record), true);
      const int error = errno;
      for (ScopedFd& more : got.more_fds) CloseNow(more.release());
      if (got.fd.get() >= 0) CloseNow(got.fd.release());
      // Every record comes with SCM_CREDENTIALS (SO_PASSCRED), even an
      // empty one: 0 bytes without them is the end.
      if (got.bytes < 0 && (error == EAGAIN || error == EWOULDBLOCK)) break;
      if (got.bytes < 0) break;
      if (got.bytes == 0 && !got.has_credentials && got.fd_count() == 0) break;
    }
  }
  close(connection);
}

}  // namespace

DescriptorCloser::DescriptorCloser(DescriptorCloserLimits limits)
    : limits_(limits), state_(std::make_shared<State>()) {}

DescriptorCloser::~DescriptorCloser() {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  auto finished = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    return s.threads == 0;
  };
  if (!s.mu.AwaitWithTimeout(absl::Condition(&finished), kShutdownWait)) {
    size_t left = 0;
    for (const auto& [uid, of] : s.uids) left += of.fds + of.connections;
    spdlog::error(
        "descriptor closer: {} descriptors still closing after {}; "
        "leaving them to the process's exit",
        left, absl::FormatDuration(kShutdownWait));
  }
}

void DescriptorCloser::Dispose(uid_t uid, ScopedFd fd) {
  if (fd.get() < 0) return;
  // Only a memfd is closed here: its release waits for nobody. Everything
  // else goes to the uid's thread untouched, even a pipe (its release takes
  // the pipe's mutex) or a TCP socket (SO_LINGER takes the socket's lock):
  // a client can hold either for as long as it likes, with a write from a
  // buffer whose page fault it stalls.
  if (fcntl(fd.get(), F_GET_SEALS) >= 0) return;  // ~ScopedFd closes it
  if (Enqueue(uid, &fd)) return;
  // At a limit: the uid's thread is stuck behind closes that do not return
  // (a FUSE server that never answers FLUSH, say) and this descriptor may
  // well be another one. Closing it here could block the caller the same
  // way, so it stays open for the daemon's lifetime. Callers that keep
  // Headroom() never get here.
  leaked_.fetch_add(1);
  if (!warned_full_.exchange(true)) {
    spdlog::error(
        "descriptor closer: uid {} (or all uids together) holds the most "
        "refused descriptors allowed and its closes make no progress; "
        "further refused descriptors are left open",
        uid);
  }
  fd.release();
}

bool DescriptorCloser::Enqueue(uid_t uid, ScopedFd* fd) {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  auto it = s.uids.find(uid);
  const size_t of_uid = it == s.uids.end() ? 0 : it->second.fds;
  if (of_uid >= limits_.max_per_uid || s.fds >= limits_.max_total) return false;
  Push(s, uid, Item{fd->release(), false});
  return true;
}

void DescriptorCloser::CloseConnection(uid_t uid, ScopedFd connection) {
  if (connection.get() < 0) return;
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  Push(s, uid, Item{connection.release(), true});
}

void DescriptorCloser::Push(State& s, uid_t uid, Item item) {
  OfUid& of = s.uids[uid];
  of.items.push_back(item);
  if (item.connection) {
    ++of.connections;
  } else {
    ++of.fds;
    ++s.fds;
  }
  if (of.running) return;
  try {
    std::thread(Loop, state_, uid).detach();
  } catch (const std::system_error& e) {
    // Left queued: the uid's next descriptor tries again.
    spdlog::error("descriptor closer: cannot start a thread: {}", e.what());
    return;
  }
  of.running = true;
  ++s.threads;
}

size_t DescriptorCloser::Headroom(uid_t uid) const {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  auto it = s.uids.find(uid);
  const size_t of_uid = it == s.uids.end() ? 0 : it->second.fds;
  const size_t for_uid =
      of_uid >= limits_.max_per_uid ? 0 : limits_.max_per_uid - of_uid;
  const size_t for_all =
      s.fds >= limits_.max_total ? 0 : limits_.max_total - s.fds;
  return std::min(for_uid, for_all);
}

size_t DescriptorCloser::pending() const {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  return s.fds;
}

size_t DescriptorCloser::pending(uid_t uid) const {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  auto it = s.uids.find(uid);
  return it == s.uids.end() ? 0 : it->second.fds;
}

size_t DescriptorCloser::connections(uid_t uid) const {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  auto it = s.uids.find(uid);
  return it == s.uids.end() ? 0 : it->second.connections;
}

void DescriptorCloser::Loop(std::shared_ptr<State> state, uid_t uid) {
  State& s = *state;
  while (true) {
    Item item;
    {
      absl::MutexLock lock(&s.mu);
      OfUid& of = s.uids[uid];
      if (of.items.empty()) {
        of.running = false;
        if (of.fds == 0 && of.connections == 0) s.uids.erase(uid);
        --s.threads;
        return;
      }
      item = of.items.front();
      of.items.pop_front();
    }
    if (item.connection) {
      CloseConnectionNow(item.fd);
    } else {
      CloseNow(item.fd);
    }
    absl::MutexLock lock(&s.mu);
    OfUid& of = s.uids[uid];
    if (item.connection) {
      --of.connections;
    } else {
      --of.fds;
      --s.fds;
    }
  }
}

}  // namespace hostkv
