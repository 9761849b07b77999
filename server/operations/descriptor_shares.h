// How the daemon's descriptor limit (RLIMIT_NOFILE, raised to its hard
// limit at start) is shared out among what clients can make it hold, so that
// all users together, however many uids they have, cannot run it out of
// descriptors: gRPC's listener does not recover once accept() fails with
// EMFILE, and state files, tier connections and logs need descriptors too.
//
// Of a limit L:
//   session-socket connections  1/4 (and at most --max_session_connections)
//   gRPC connections, unix:     1/4
//   passed descriptors (kPassFd)      1/8
//   refused descriptors waiting to be closed  1/8 (at least two records)
//   command rings (a segment each)   1/16 (and at most --max_command_rings)
//   the daemon's own                  the rest, at least 3/16
// (A session holds no descriptor: its signal segment is mapped by name.)
// Each total also keeps its last eighth for uids holding little of it
// (MayTakeShared): uids that together fill the rest leave room for new ones.
#ifndef HOSTKV_SERVER_OPERATIONS_DESCRIPTOR_SHARES_H_
#define HOSTKV_SERVER_OPERATIONS_DESCRIPTOR_SHARES_H_

#include <cstdint>
#include <string>

namespace hostkv {

struct DescriptorShares {
  uint64_t limit = 0;
  uint32_t session_connections = 0;
  uint32_t grpc_connections = 0;
  uint32_t passed_fds = 0;
  uint64_t refused_fds = 0;
  uint32_t command_rings = 0;

  // What the shares leave to the daemon itself.
  uint64_t reserve() const;
  std::string ToString() const;
};

// The shares of `limit` descriptors.
DescriptorShares ShareDescriptorLimit(uint64_t limit);

// Whether a uid that holds `of_uid` of a total of which `held` are held
// now, at most `most`, may take one more. Below seven eighths of `most`,
// any uid may (its own bound aside); the last eighth goes only to uids that
// hold less than a 64th of `most` (at least one), so that it serves at
// least eight of them.
bool MayTakeShared(uint64_t of_uid, uint64_t held, uint64_t most);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_DESCRIPTOR_SHARES_H_
