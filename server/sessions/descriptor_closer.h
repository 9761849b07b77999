// Descriptors that clients pass over the session socket and the daemon does
// not keep: what they are, and how to get rid of them without letting a
// client stall the thread that refused them. A close can block for as long
// as the client likes: a TCP socket with SO_LINGER and unsent data waits in
// its final close, a FUSE file's close waits for the FUSE server's answer to
// FLUSH, and a Unix socket's close releases the descriptors still queued in
// it (each of which can be such a socket) in the closing thread.
#ifndef HOSTKV_SERVER_SESSIONS_DESCRIPTOR_CLOSER_H_
#define HOSTKV_SERVER_SESSIONS_DESCRIPTOR_CLOSER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/contract/shm_segment.h"

namespace hostkv {

enum class DescriptorKind {
  kMemfd,        // shmem or hugetlbfs file (F_GET_SEALS works): memfds
  kInetSocket,   // AF_INET / AF_INET6 socket
  kOtherSocket,  // any other socket, AF_UNIX included
  kPipe,         // pipe or FIFO
  kOther,        // anything else: regular files (FUSE ones too), devices, ...
};

// What descriptor `fd` is. Only asks the kernel questions that neither
// reach the file's filesystem nor take a lock a client can hold (fcntl
// F_GET_SEALS, getsockopt SO_TYPE / SO_DOMAIN, the /proc/self/fd link):
// fstat or fstatfs could wait on a FUSE server, F_GETPIPE_SZ on the pipe's
// mutex.
DescriptorKind KindOfDescriptor(int fd);

// For logs: "memfd", "socket (AF_INET, SOCK_STREAM)", "pipe", ...
std::string DescribeDescriptor(int fd);

// Disposes of descriptors the daemon refuses. Thread-safe. Owns one thread
// that closes, one at a time, what may block, from a queue of at most
// `max_queued` descriptors.
class DescriptorCloser {
 public:
  static constexpr size_t kDefaultMaxQueued = 1024;
  // How long the destructor waits for queued closes before it gives up on
  // the thread (a close that never returns must not hold up the daemon's
  // exit).
  static constexpr absl::Duration kShutdownWait = absl::Seconds(2);

  explicit DescriptorCloser(size_t max_queued = kDefaultMaxQueued);
  // Closes what is queued and joins the thread; if that takes longer than
  // kShutdownWait, logs and detaches it (it owns what it still uses).
  ~DescriptorCloser();

  DescriptorCloser(const DescriptorCloser&) = delete;
  DescriptorCloser& operator=(const DescriptorCloser&) = delete;

  // Gets rid of `fd` without blocking the caller. Memfds are closed here
  // (their release waits for nobody); everything else goes to the closer's
  // thread untouched, which makes AF_INET(6) sockets close abortively
  // (SO_LINGER {1, 0}: a reset, no wait, no orphan left behind) before it
  // closes them. If that thread's queue is full (it is stuck behind closes
  // that do not return), `fd` is left open for good, counted in leaked() and
  // logged once: closing it here could block the same way.
  void Dispose(ScopedFd fd);

  // Closes `fd` on the closer's thread. Returns false, and leaves `*fd` with
  // the caller, when the queue is full.
  bool Enqueue(ScopedFd* fd);

  // Closes `connection`, a Unix socket of a client that passes descriptors
  // (SO_PASSCRED set, as on the session socket), without blocking: shuts it
  // for reading, receives what is still queued and disposes of every
  // descriptor that came (as Dispose does), then closes it here. If it
  // cannot be emptied that way, the closer's thread closes it (or, with the
  // queue full, it is left open and counted in leaked()).
  void CloseConnection(ScopedFd connection);

  // Descriptors queued or being closed.
  size_t pending() const;
  // Descriptors Dispose left open because the queue was full.
  uint64_t leaked() const { return leaked_.load(); }

 private:
  // What the thread uses: shared with it, so that it may outlive the closer
  // if a close never returns.
  struct Queue {
    absl::Mutex mu;
    std::deque<int> fds ABSL_GUARDED_BY(mu);
    size_t closing ABSL_GUARDED_BY(mu) = 0;  // taken off fds, not yet closed
    bool stopping ABSL_GUARDED_BY(mu) = false;
    bool done ABSL_GUARDED_BY(mu) = false;  // the thread has returned
  };
  static void Loop(Queue* queue);

  const size_t max_queued_;
  const std::shared_ptr<Queue> queue_;
  std::atomic<uint64_t> leaked_{0};
  std::atomic<bool> warned_full_{false};
  std::thread thread_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SESSIONS_DESCRIPTOR_CLOSER_H_
