// How a client turns the address a user gives into one gRPC dials, and what
// it says when a Unix socket is there but closed to it.
#ifndef HOSTKV_CLIENT_DAEMON_TARGET_H_
#define HOSTKV_CLIENT_DAEMON_TARGET_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hostkv {

// The target: `target`, else $HOSTKV_TARGET, else kDefaultTarget.
// "unix:PATH" and "HOST:PORT" as given; "tcp:PORT" (hostkvd's own --listen
// form) as "127.0.0.1:PORT". InvalidArgument, suggesting "unix:PATH", for a
// bare path ("/run/hostkv/hostkvd.sock", "./x.sock"), which gRPC would take
// for a DNS name and wait on.
absl::StatusOr<std::string> ResolveDaemonTarget(const std::string& target);

// OK if this process may connect to the Unix socket at `path`. Otherwise
// Unavailable "no hostkvd socket at PATH (is hostkvd running?)" when nothing
// is there, or PermissionDenied naming the directory or socket that is
// closed to this process, its owner, group and mode, and what would open it
// (hostkvd's uid, its --socket_group).
absl::Status CheckDaemonSocket(const std::string& path);

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_DAEMON_TARGET_H_
