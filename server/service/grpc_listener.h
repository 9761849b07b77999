// hostkvd's gRPC listening socket, owned by the daemon rather than by gRPC.
//
// gRPC's own listener stops accepting for good once accept() fails with
// EMFILE (gRPC 1.51): one moment without a free descriptor would leave the
// daemon unreachable to every user until restarted. This listener accepts
// each connection itself and hands it to gRPC (AddInsecureChannelFromFd).
// Out of descriptors, it gives up a spare one to accept and close the
// waiting connection (its client sees the connection refused and
// retries), and serves again as soon as descriptors are free.
//
// A Unix-socket peer is a known uid (SO_PEERCRED): each uid holds at most
// --max_grpc_connections_per_uid connections (PeerConnections); one more
// is closed at once, with a warning naming the uid and the flag.
#ifndef HOSTKV_SERVER_SERVICE_GRPC_LISTENER_H_
#define HOSTKV_SERVER_SERVICE_GRPC_LISTENER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "proto/contract/shm_segment.h"
#include "server/operations/instance_lock.h"
#include "server/service/peer_connections.h"

namespace grpc {
class Server;
}

namespace hostkv {

struct GrpcListenerStats {
  uint64_t accepted = 0;
  uint64_t shed = 0;          // closed at once: no descriptor was free
  uint64_t over_uid_bound = 0;  // closed at once: the uid's bound
};

class GrpcListener {
 public:
  // Binds and listens on `listen`: "unix:PATH" (an existing socket file
  // there is replaced: the caller holds the instance lock) or "HOST:PORT"
  // ("[::1]:PORT" for IPv6). On a Unix socket, one uid holds at most
  // `max_connections_per_uid` connections and all together
  // `max_connections` (0: no bound), PeerConnections.
  static absl::StatusOr<std::unique_ptr<GrpcListener>> Listen(
      const std::string& listen, uint32_t max_connections_per_uid,
      uint32_t max_connections = 0);

  ~GrpcListener();  // Stop()

  // Hands every connection accepted from now on to `server` (started),
  // from a thread of its own.
  void Serve(grpc::Server* server);
  // Stops accepting; connections already handed over stay with gRPC. A
  // Unix socket's path is removed if it still names this socket.
  void Stop();

  GrpcListenerStats stats() const;
  const std::string& path() const { return path_; }  // empty for TCP

 private:
  GrpcListener(ScopedFd listener, std::string path, bool unix_socket,
               uint32_t max_connections_per_uid, uint32_t max_connections);
  void Run(grpc::Server* server);
  // Hands `fd` to gRPC unless its uid is at its bound.
  void HandOver(grpc::Server* server, ScopedFd fd);
  // Whether a waiting connection was taken and closed.
  bool ShedOne();

  ScopedFd listener_;
  ScopedFd wake_;      // eventfd: Stop() wakes the thread
  ScopedFd reserve_;   // a spare descriptor given up to shed a connection
  const std::string path_;
  const bool unix_socket_;
  PeerConnections peers_;
  const BoundPath bound_;  // the Unix socket file, as bound
  std::thread thread_;
  std::atomic<uint64_t> accepted_{0}, shed_{0}, over_uid_bound_{0};
  uint64_t last_warning_ns_ = 0;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SERVICE_GRPC_LISTENER_H_
