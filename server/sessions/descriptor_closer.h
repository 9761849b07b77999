// Descriptors that clients pass over the session socket and the daemon does
// not keep: what they are, and how to get rid of them without letting a
// client stall the thread that refused them. A close can block for as long
// as the client likes: a TCP socket with SO_LINGER and unsent data waits in
// its final close, a FUSE file's close waits for the FUSE server's answer to
// FLUSH, and a Unix socket's close releases the descriptors still queued in
// it (each of which can be such a socket) in the closing thread.
#ifndef HOSTKV_SERVER_SESSIONS_DESCRIPTOR_CLOSER_H_
#define HOSTKV_SERVER_SESSIONS_DESCRIPTOR_CLOSER_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
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

// How many refused descriptors the closer holds (queued or being closed).
struct DescriptorCloserLimits {
  // Of one uid's (--max_refused_fds_per_uid).
  size_t max_per_uid = 1024;
  // Of all uids together (main.cc: an eighth of the descriptor limit).
  size_t max_total = 4096;
};

// Disposes of descriptors the daemon refuses, and of the session
// connections it closes. Thread-safe. Each uid's descriptors are closed,
// one at a time, by a thread of that uid's own (started when it has
// something to close, gone when it has nothing left), so that a close that
// does not return stalls only the closes of the uid who passed it. Holds at
// most DescriptorCloserLimits descriptors besides connections; callers that
// receive descriptors keep Headroom(uid) above what one record can carry.
class DescriptorCloser {
 public:
  // How long the destructor waits for queued closes before it gives up on
  // the threads (a close that never returns must not hold up the daemon's
  // exit).
  static constexpr absl::Duration kShutdownWait = absl::Seconds(2);

  explicit DescriptorCloser(DescriptorCloserLimits limits = {});
  // Waits up to kShutdownWait for what is queued to be closed; past that,
  // logs and leaves the threads (they own what they still use).
  ~DescriptorCloser();

  DescriptorCloser(const DescriptorCloser&) = delete;
  DescriptorCloser& operator=(const DescriptorCloser&) = delete;

  // Gets rid of `fd`, passed by `uid`, without blocking the caller. Memfds
  // are closed here (their release waits for nobody); everything else goes
  // to the uid's thread untouched, which makes AF_INET(6) sockets close
  // abortively (SO_LINGER {1, 0}: a reset, no wait, no orphan left behind)
  // before it closes them. If the uid or the daemon is at its limit (its
  // thread is stuck behind closes that do not return), `fd` is left open
  // for good, counted in leaked() and logged once: closing it here could
  // block the same way.
  void Dispose(uid_t uid, ScopedFd fd);

  // Closes `fd` on the uid's thread. Returns false, and leaves `*fd` with
  // the caller, when the uid or the daemon is at its limit.
  bool Enqueue(uid_t uid, ScopedFd* fd);

  // Closes `connection`, a Unix socket of `uid` that may hold descriptors
  // in its queue (records not read yet), on the uid's thread: it shuts it
  // for reading, receives what is queued one record at a time, closing
  // each descriptor as it comes, then closes it. Never refused: counted in
  // connections(uid) until it is closed (the caller counts those against
  // the uid's connections).
  void CloseConnection(uid_t uid, ScopedFd connection);

  // How many more descriptors `uid` may hand over before Enqueue refuses.
  size_t Headroom(uid_t uid) const;
  // Descriptors queued or being closed, connections aside: all, of `uid`.
  size_t pending() const;
  size_t pending(uid_t uid) const;
  // Connections of `uid` queued or being closed.
  size_t connections(uid_t uid) const;
  // Descriptors Dispose left open because a limit was reached.
  uint64_t leaked() const { return leaked_.load(); }

 private:
  struct Item {
    int fd;
    bool connection;
  };
  struct OfUid {
    std::deque<Item> items;
    size_t fds = 0;          // queued or closing, connections aside
    size_t connections = 0;  // queued or closing
    bool running = false;    // its thread runs
  };
  // What the threads use: shared with them, so that they may outlive the
  // closer if a close never returns.
  struct State {
    absl::Mutex mu;
    absl::flat_hash_map<uid_t, OfUid> uids ABSL_GUARDED_BY(mu);
    size_t fds ABSL_GUARDED_BY(mu) = 0;  // all uids', connections aside
    size_t threads ABSL_GUARDED_BY(mu) = 0;
  };
  // Queues `item` for `uid` in `s` (*state_), starting its thread if none
  // runs.
  void Push(State& s, uid_t uid, Item item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  static void Loop(std::shared_ptr<State> state, uid_t uid);

  const DescriptorCloserLimits limits_;
  const std::shared_ptr<State> state_;
  std::atomic<uint64_t> leaked_{0};
  std::atomic<bool> warned_full_{false};
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SESSIONS_DESCRIPTOR_CLOSER_H_
