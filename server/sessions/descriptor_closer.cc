#include "server/sessions/descriptor_closer.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

DescriptorCloser::DescriptorCloser(size_t max_queued)
    : max_queued_(max_queued), queue_(std::make_shared<Queue>()) {
  thread_ = std::thread([queue = queue_] { Loop(queue.get()); });
}

DescriptorCloser::~DescriptorCloser() {
  Queue& q = *queue_;
  bool done;
  {
    absl::MutexLock lock(&q.mu);
    q.stopping = true;
    auto finished = [&q]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu) { return q.done; };
    done = q.mu.AwaitWithTimeout(absl::Condition(&finished), kShutdownWait);
    if (!done) {
      spdlog::error(
          "descriptor closer: {} descriptors still closing after {}; "
          "leaving them to the process's exit",
          q.fds.size() + q.closing, absl::FormatDuration(kShutdownWait));
    }
  }
  if (done) {
    thread_.join();
  } else {
    thread_.detach();  // it holds its own reference to the queue
  }
}

void DescriptorCloser::Dispose(ScopedFd fd) {
  if (fd.get() < 0) return;
  // Only a memfd is closed here: its release waits for nobody. Everything
  // else goes to the closer's thread untouched, even a pipe (its release
  // takes the pipe's mutex) or a TCP socket (SO_LINGER takes the socket's
  // lock): a client can hold either for as long as it likes, with a write
  // from a buffer whose page fault it stalls.
  if (fcntl(fd.get(), F_GET_SEALS) >= 0) return;  // ~ScopedFd closes it
  if (Enqueue(&fd)) return;
  // The queue is full: the thread is stuck behind closes that do not return
  // (a FUSE server that never answers FLUSH, say) and this descriptor may
  // well be another one. Closing it here could block the caller the same
  // way, so it stays open for the daemon's lifetime: one descriptor-table
  // slot (the daemon raises its limit at start and sheds session
  // connections when descriptors run out). The caller keeps refusing.
  leaked_.fetch_add(1);
  if (!warned_full_.exchange(true)) {
    spdlog::error(
        "descriptor closer: {} refused descriptors are waiting to "
        "be closed and the closer is not making progress; further "
        "refused descriptors are left open",
        max_queued_);
  }
  fd.release();
}

bool DescriptorCloser::Enqueue(ScopedFd* fd) {
  Queue& q = *queue_;
  absl::MutexLock lock(&q.mu);
  if (q.fds.size() + q.closing >= max_queued_) return false;
  q.fds.push_back(fd->release());
  return true;
}

void DescriptorCloser::CloseConnection(ScopedFd connection) {
  // Once it is shut for reading no record can join its queue (the kernel
  // tests for that and queues under the lock shutdown takes), so receiving
  // until it is empty leaves nothing for close() to release. The sender's
  // socket buffer keeps the queue to a few hundred records.
  constexpr int kMaxDrainedRecords = 4096;
  bool drained = false;
  if (shutdown(connection.get(), SHUT_RD) == 0) {
    for (int i = 0; i < kMaxDrainedRecords && !drained; ++i) {
      SessionMessage record;
      ReceivedRecord got =
          ReceiveRecord(connection.get(), &record, sizeof(record), true);
      const int error = errno;
      // Every record comes with SCM_CREDENTIALS (SO_PASSCRED), even an empty
      // one: 0 bytes without them is the end.
      const bool end = got.bytes < 0 ? (error == EAGAIN || error == EWOULDBLOCK)
                                     : got.bytes == 0 && !got.has_credentials &&
                                           got.fd_count() == 0;
      if (got.bytes < 0 && !end) break;
      drained = end;
      Dispose(std::move(got.fd));
      for (ScopedFd& more : got.more_fds) Dispose(std::move(more));
    }
  }
  if (drained) return;  // closed here: nothing is left in it to release
  if (Enqueue(&connection)) return;
  // The closer is stuck and full: closing it here could release queued
  // descriptors on the caller's thread. Left open, as Dispose does.
  leaked_.fetch_add(1);
  connection.release();
}

size_t DescriptorCloser::pending() const {
  Queue& q = *queue_;
  absl::MutexLock lock(&q.mu);
  return q.fds.size() + q.closing;
}

void DescriptorCloser::Loop(Queue* queue) {
  Queue& q = *queue;
  while (true) {
    int fd;
    {
      absl::MutexLock lock(&q.mu);
      auto ready = [&q]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu) {
        return !q.fds.empty() || q.stopping;
      };
      q.mu.Await(absl::Condition(&ready));
      if (q.fds.empty()) {
        q.done = true;
        return;
      }
      fd = q.fds.front();
      q.fds.pop_front();
      ++q.closing;
    }
    // A TCP socket closes abortively (SO_LINGER {1, 0}: a reset, no wait
    // for unsent data, no orphan); harmless on other sockets.
    if (KindOfDescriptor(fd) == DescriptorKind::kInetSocket) {
      const linger abortive{1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &abortive, sizeof(abortive));
    }
    // May block for as long as the client who passed it likes.
    close(fd);
    absl::MutexLock lock(&q.mu);
    --q.closing;
  }
}

}  // namespace hostkv
