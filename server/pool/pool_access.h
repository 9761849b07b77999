// Who may use and who may delete a pool: the pool's owner (the uid of the
// session that created it, the daemon for --config pools, or "unverified"
// for sessions without a session socket) and its access mode.
#ifndef HOSTKV_SERVER_POOL_POOL_ACCESS_H_
#define HOSTKV_SERVER_POOL_POOL_ACCESS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "hostkv/v1/hostkv.pb.h"
#include "server/sessions/session.h"

namespace hostkv {

// Who is asking: the peer of an attached session, or nobody known.
struct Principal {
  std::optional<PeerCredentials> peer;  // nullopt: unverified (no socket)

  static Principal Of(const Session& session) { return {session.peer()}; }
  bool root() const { return peer.has_value() && peer->uid == 0; }
};

// The owner record of a pool `who` creates with `access`.
v1::PoolOwner OwnerFor(const Principal& who, v1::PoolAccess access);
// The owner record of a --config pool: the daemon's uid and `gid`.
v1::PoolOwner DaemonOwner(uint32_t uid, uint32_t gid, v1::PoolAccess access);

// OK if `who` may allocate in, register buffers for, or attach to pool
// `name`: root; the owner's uid; members of the owner's group (access
// GROUP); anyone (ANY). A pool created by an unverified session is usable
// by unverified sessions, and so is a --config pool with access GROUP (an
// unverified session passed the gRPC socket's permissions, which are the
// group's, or the TCP token). PermissionDenied otherwise, saying whose it
// is.
absl::Status CheckPoolUse(const std::string& name, const v1::PoolOwner& owner,
                          const Principal& who);

// OK if `who` may delete (or redefine) pool `name`: root, the owner's uid,
// or, for a pool of an unverified session, another unverified session.
absl::Status CheckPoolAdmin(const std::string& name, const v1::PoolOwner& owner,
                            const Principal& who);

// "owner", "group" or "any" -> the enum; InvalidArgument otherwise.
absl::StatusOr<v1::PoolAccess> ParsePoolAccess(const std::string& text);
const char* PoolAccessName(v1::PoolAccess access);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_POOL_ACCESS_H_
