// Keeps two daemons off one socket: gRPC silently unlinks an existing socket
// file before it binds, so the daemon holds an flock on "<socket>.lock".
#ifndef HOSTKV_SERVER_INSTANCE_LOCK_H_
#define HOSTKV_SERVER_INSTANCE_LOCK_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/contract/shm_segment.h"

namespace hostkv {

// Holds the lock until destroyed. Move-only.
class InstanceLock {
 public:
  // Creates the socket's directory (0750) if missing, then locks
  // "<socket_path>.lock". FailedPrecondition if another daemon holds it.
  static absl::StatusOr<InstanceLock> Acquire(const std::string& socket_path);

 private:
  explicit InstanceLock(ScopedFd fd) : fd_(std::move(fd)) {}
  ScopedFd fd_;
};

// The prefix of this daemon's shared-memory segments ("/hostkv.<id>."). A
// Unix-socket daemon's id is a hash of its socket path, so the next daemon on
// the same socket (which holds the instance lock) knows the segments of its
// dead predecessor are stale, whatever its pid was (in a container it is
// always 1). A TCP daemon's id is "p<pid>".
std::string SegmentPrefix(const std::string& socket_path);

// Removes segments left by dead daemons: every "/hostkv.<id>.*" of this
// daemon's own prefix (REQUIRES: the instance lock is held), and every
// "/hostkv.p<pid>.*" whose pid is not running. Returns how many.
int RemoveStaleSegments(const std::string& own_prefix);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_INSTANCE_LOCK_H_
