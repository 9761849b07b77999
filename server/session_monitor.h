// Ends sessions whose clients are gone: a session with an attached session
// socket ends when that connection closes (the client exited or was killed);
// one without ends after `lease` without a request. Also accepts the
// attachments and reads the peer's credentials (SO_PEERCRED).
#ifndef HOSTKV_SERVER_SESSION_MONITOR_H_
#define HOSTKV_SERVER_SESSION_MONITOR_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/contract/shm_segment.h"
#include "server/request_handler.h"

namespace hostkv {

// Runs one thread; Start and the destructor are not thread-safe.
class SessionMonitor {
 public:
  // Listens for session sockets on `socket_path` (none if empty), with
  // `mode` and, if gid >= 0, that group. Returns the bind error.
  static absl::StatusOr<std::unique_ptr<SessionMonitor>> Start(
      RequestHandler* handler, const std::string& socket_path, mode_t mode,
      gid_t gid, absl::Duration lease);
  ~SessionMonitor();  // Stops the thread; closes the connections.

 private:
  SessionMonitor(RequestHandler* handler, std::string socket_path,
                 absl::Duration lease, ScopedFd listener, ScopedFd epoll,
                 ScopedFd wake);
  void Loop();
  void Accept();
  // Handles readable/closed connection `fd`; returns false to drop it.
  bool Serve(int fd);
  void Drop(int fd);

  RequestHandler* const handler_;
  const std::string socket_path_;
  const absl::Duration lease_;
  ScopedFd listener_;
  ScopedFd epoll_;
  ScopedFd wake_;  // eventfd that stops the loop
  // Connection fd -> attached session id (0 until attached). Loop thread only.
  absl::flat_hash_map<int, uint64_t> connections_;
  std::thread thread_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SESSION_MONITOR_H_
