// The gRPC connections each local uid holds, bounded per uid
// (--max_grpc_connections_per_uid) and all together (a share of the
// descriptor limit, server/operations/descriptor_shares.h, whose last eighth
// is kept for uids that hold few).
//
// gRPC owns an accepted connection's descriptor and closes it when the
// connection ends, without telling anyone. A connection is therefore
// remembered as its descriptor number and its socket's inode, and counted
// as open while that number still names that socket: descriptor numbers
// are reused, socket inodes are not while the socket is open. A uid's
// connections are recounted only when it reaches its bound, so the common
// accept costs one hash lookup.
#ifndef HOSTKV_SERVER_SERVICE_PEER_CONNECTIONS_H_
#define HOSTKV_SERVER_SERVICE_PEER_CONNECTIONS_H_

#include <sys/types.h>

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace hostkv {

class PeerConnections {
 public:
  // `max_per_uid`, `max_total` 0: no bound.
  explicit PeerConnections(uint32_t max_per_uid, uint32_t max_total = 0)
      : max_per_uid_(max_per_uid), max_total_(max_total) {}

  enum class Admission { kAdmitted, kOverUidBound, kOverTotal, kNotASocket };
  // Whether `uid` may have one more connection; if so, `fd` (an accepted
  // socket) is remembered as one of its connections. Not thread-safe: the
  // listener's one thread calls it.
  Admission Admit(uid_t uid, int fd);

  // Connections of `uid` still open (recounted now).
  uint32_t Open(uid_t uid);

  uint32_t max_per_uid() const { return max_per_uid_; }
  uint32_t max_total() const { return max_total_; }
  // Connections remembered (some may have closed since).
  size_t held() const { return by_fd_.size(); }

 private:
  struct Connection {
    uid_t uid;
    ino_t inode;
  };
  // Forgets the connections of `uid` whose descriptor no longer names
  // their socket.
  void Recount(uid_t uid);
  // Forgets every closed connection: at most every kRecountAllEvery (it
  // looks at each descriptor), so that connecting in a loop near the total
  // costs the listener little.
  void RecountAll();
  void Forget(int fd);
  uint32_t CountOf(uid_t uid) const;

  static constexpr absl::Duration kRecountAllEvery = absl::Milliseconds(100);
  const uint32_t max_per_uid_;
  const uint32_t max_total_;
  absl::Time recounted_all_ = absl::InfinitePast();
  // Every remembered connection by descriptor number: at most one entry per
  // number, so at most the descriptor limit's worth.
  absl::flat_hash_map<int, Connection> by_fd_;
  absl::flat_hash_map<uid_t, uint32_t> count_;
};

// The inode of the socket `fd` names; 0 when `fd` is not open.
ino_t SocketInode(int fd);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SERVICE_PEER_CONNECTIONS_H_
