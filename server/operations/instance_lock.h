// Keeps two daemons off one socket: gRPC silently unlinks an existing socket
// file before it binds, so the daemon holds an flock on "<socket>.lock".
// Also the checks that keep another local user from steering the daemon
// through its socket directory (planted symlinks, replaced entries).
#ifndef HOSTKV_SERVER_OPERATIONS_INSTANCE_LOCK_H_
#define HOSTKV_SERVER_OPERATIONS_INSTANCE_LOCK_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/contract/shm_segment.h"

namespace hostkv {

// Holds the lock until destroyed. Move-only.
class InstanceLock {
 public:
  // Creates the socket's directory (missing components 0750), then opens the
  // directory itself without following a symlink and locks
  // "<socket_path>.lock" inside it (created 0600, never through a symlink).
  // FailedPrecondition, saying what is wrong and how to fix it, if the
  // directory is a symlink, is owned by neither hostkvd's euid nor root, or
  // is writable by group/others without the sticky bit (/tmp itself is
  // fine); if the lock file is a symlink, not a regular file or not owned by
  // hostkvd's euid; or if another daemon holds the lock.
  static absl::StatusOr<InstanceLock> Acquire(const std::string& socket_path);

  // Removes "<socket_path>.lock" (while still holding it), then unlocks. A
  // daemon that opened the file before the removal finds, once it holds the
  // lock, that the path no longer names its file, and opens it again.
  ~InstanceLock();
  InstanceLock(InstanceLock&&) = default;
  InstanceLock& operator=(InstanceLock&&) = default;

 private:
  InstanceLock(ScopedFd dir_fd, std::string name, ScopedFd fd)
      : dir_fd_(std::move(dir_fd)), name_(std::move(name)), fd_(std::move(fd)) {}
  ScopedFd dir_fd_;
  std::string name_;  // of the lock file in dir_fd_
  ScopedFd fd_;
};

// Sets the mode (and the group, unless gid is -1) of the socket hostkvd has
// just bound at `path`, without following a symlink: FailedPrecondition if
// `path` is not a socket owned by hostkvd's euid (something was planted
// there), else the chmod/chown error.
absl::Status SecureSocketPath(const std::string& path, mode_t mode, gid_t gid);

// The file a path names (device and inode), taken when hostkvd bound it, so
// that it later removes the path only while it still names that file (after
// a --takeover renamed it away, the path may be the next daemon's).
struct BoundPath {
  std::string path;
  dev_t dev = 0;
  ino_t ino = 0;
  bool known = false;  // stat() found it
};
// What `path` names now (known = false if nothing).
BoundPath IdentifyPath(const std::string& path);
// Unlinks bound.path if it still names the file bound.dev/ino; returns
// whether it did.
bool UnlinkIfStillOurs(const BoundPath& bound);

// Connects `fd` (a blocking Unix socket) to `path`, waiting at most `limit`
// while the listener's backlog is full: in a directory others may write to,
// another user's listener may never accept. Returns connect's result (-1
// with errno EAGAIN once `limit` passed, ENAMETOOLONG for a long path).
int ConnectWithin(int fd, const std::string& path, absl::Duration limit);

// The prefix of this daemon's shared-memory segments ("/hostkv.<id>."). A
// Unix-socket daemon's id is a hash of its socket's real path (realpath() of
// the directory + "/" + the file name, so "./x.sock", "d/./x.sock" and the
// absolute spelling agree), so the next daemon on the same socket (which
// holds the instance lock) knows the segments of its dead predecessor are
// stale, whatever its pid was (in a container it is always 1). A TCP
// daemon's id is "p<pid>".
// REQUIRES (for the real path): the socket's directory exists; otherwise the
// path is hashed as spelled.
std::string SegmentPrefix(const std::string& socket_path);

// Removes segments left by dead daemons: every "/hostkv.<id>.*" of this
// daemon's own prefix (REQUIRES: the instance lock is held), and every
// "/hostkv.p<pid>.*" whose pid is not running. Returns how many.
int RemoveStaleSegments(const std::string& own_prefix);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_INSTANCE_LOCK_H_
