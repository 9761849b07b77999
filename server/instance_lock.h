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

// Removes /dev/shm segments "hostkv.<pid>.*" left by daemons that are no
// longer running; returns how many.
int RemoveStaleSegments();

}  // namespace hostkv

#endif  // HOSTKV_SERVER_INSTANCE_LOCK_H_
