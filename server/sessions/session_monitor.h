// The session socket ("<socket>.session"): accepts connections, opens or
// attaches sessions bound to the peer's credentials, takes passed memfds,
// and ends a session when its connection closes (the client exited or was
// killed). Connections are limited in number, per uid and in time until
// they attach. The only descriptor a client may pass is one memfd with a
// kPassFd record; any other is refused and handed to a DescriptorCloser, so
// that no client's descriptor is ever closed on the monitor's thread in a
// way that can block it. Descriptors reach the daemon only on connections
// with a session (SO_PASSRIGHTS is off until then, where the kernel has it:
// Linux 6.16) and only while the sender's uid has room in the closer: past
// it, its connections are not read and, where the kernel can, refuse
// descriptors (the sender's sendmsg fails with EPERM) until its closes
// catch up.
#ifndef HOSTKV_SERVER_SESSIONS_SESSION_MONITOR_H_
#define HOSTKV_SERVER_SESSIONS_SESSION_MONITOR_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/contract/session_socket.h"
#include "proto/contract/shm_segment.h"
#include "server/operations/instance_lock.h"
#include "server/service/ring_quota.h"
#include "server/service/ring_server.h"
#include "server/service/request_handler.h"
#include "server/sessions/descriptor_closer.h"
#include "server/sessions/session_reaper.h"

namespace hostkv {

struct ConnectionLimits {
  uint32_t max_connections = 8192;         // all users together
  uint32_t max_connections_per_uid = 512;  // attached or not
  // A connection that has not opened or attached a session by then is
  // closed.
  absl::Duration attach_timeout = absl::Seconds(10);
  // Command rings of all connections together, and of one uid; beyond them
  // a client asking for one is refused and stays on gRPC. A ring's segment
  // is charged to the memory budget; a uid's rings share
  // ceil(ring_cpu_per_uid) threads (server/service/ring_threads.h).
  uint32_t max_command_rings = 256;
  uint32_t max_command_rings_per_uid = 16;
  // Cores one uid's ring threads may use on average (0: no bound, and a
  // thread per ring).
  double ring_cpu_per_uid = 1.0;
  // How long a ring's thread polls after a call before it sleeps.
  absl::Duration command_ring_spin = RingServer::kDefaultSpin;
  // Refused descriptors and closed connections waiting to be closed
  // (--max_refused_fds_per_uid; all uids: main.cc).
  DescriptorCloserLimits refused_fds;
};

// Runs one thread; Start and the destructor are not thread-safe.
class SessionMonitor {
 public:
  // Listens for session sockets on `socket_path` (none if empty), with
  // `mode` and, if gid >= 0, that group. Unattached sessions idle for
  // `lease` end. Returns the bind error.
  static absl::StatusOr<std::unique_ptr<SessionMonitor>> Start(
      RequestHandler* handler, const std::string& socket_path, mode_t mode,
      gid_t gid, absl::Duration lease, ConnectionLimits limits = {});
  // Stops the thread, closes the connections (ending their sessions).
  ~SessionMonitor();

  // Connections open now (for tests and stats).
  size_t connections() const;

 private:
  struct Connection {
    uid_t uid = 0;  // SO_PEERCRED: the connecting process
    gid_t gid = 0;
    std::vector<uint32_t> groups;  // SO_PEERGROUPS
    absl::Time accepted;
    SessionId session;  // empty until opened or attached
    bool refused_descriptor = false;  // logged once per connection
    // SO_PASSRIGHTS on now; ever (records with descriptors may be queued).
    bool rights = false;
    bool rights_ever = false;
    bool paused = false;  // not read until its uid's closes catch up
    std::unique_ptr<RingServer> ring;  // once asked for (kOpenCommandRing)
  };

  SessionMonitor(RequestHandler* handler, std::string socket_path,
                 BoundPath bound, absl::Duration lease, ConnectionLimits limits,
                 ScopedFd listener, ScopedFd epoll, ScopedFd wake);
  void Loop();
  void Accept();
  // Accepts and refuses one connection when descriptors ran out.
  void ShedOne();
  // Handles readable/closed connection `fd` (epoll `events`); returns false
  // to drop it.
  bool Serve(int fd, uint32_t events);
  // Whether records of `c` may be read now: its uid has room in closer_ for
  // what one record can carry. Turns descriptor passing on `fd` off when
  // not, back on when so and `c` has a session.
  bool MayRead(int fd, Connection& c);
  // Stops reading `fd` / reads it again.
  void Pause(int fd, Connection& c);
  void ResumePaused();
  // SO_PASSRIGHTS on `fd`; false where the kernel lacks it.
  bool AllowDescriptors(int fd, Connection& c, bool allow);
  // Gets rid of connection `fd` of `uid`: closed here when no descriptor
  // can be queued in it, else by closer_ on the uid's thread.
  void CloseConnection(ScopedFd fd, uid_t uid, bool may_hold_descriptors);
  // Refuses freshly accepted `fd` of `uid` with `why`.
  void Refuse(ScopedFd fd, uid_t uid, const absl::Status& why);
  // Takes the descriptors that came with a record of kind `kind` out of
  // `got`: returns the memfd of a well-formed kPassFd record that carried
  // exactly that; disposes of everything else through closer_ and sets
  // *refused to the InvalidArgument error the client gets.
  ScopedFd TakeMemfd(Connection& c, SessionMessageKind kind,
                     ReceivedRecord& got, absl::Status* refused);
  // Replies to one record of connection `c`.
  bool Handle(int fd, Connection& c, const SessionMessage& m,
              const PeerCredentials& sender, ScopedFd passed);
  void Drop(int fd);
  void DropLate();
  // kOpenCommandRing: the connection's ring (started on first ask) and a
  // descriptor of it.
  void OpenCommandRing(int fd, Connection& c);

  RequestHandler* const handler_;
  const std::string socket_path_;
  // What socket_path_ named once bound: removed at the end only if it still
  // does (a --takeover daemon's path was renamed to the daemon's own).
  const BoundPath bound_;
  const ConnectionLimits limits_;
  ScopedFd listener_;
  ScopedFd epoll_;
  ScopedFd wake_;     // eventfd that stops the loop
  ScopedFd reserve_;  // a spare descriptor given up to shed a connection
  RingQuota ring_quota_;  // rings' count, memory and CPU, per uid
  // The kernel has SO_PASSRIGHTS: the listener refuses descriptors, and so
  // does each connection until it has a session.
  bool rights_switch_ = false;
  // Loop thread only.
  absl::flat_hash_map<int, Connection> connections_;
  absl::flat_hash_map<uid_t, uint32_t> per_uid_;
  std::atomic<size_t> count_{0};
  // Rings of dropped connections whose threads still finish a call; freed
  // by DropLate once ended.
  std::vector<std::unique_ptr<RingServer>> retiring_rings_;
  size_t paused_ = 0;  // connections with `paused`
  DescriptorCloser closer_;
  SessionReaper reaper_;
  std::thread thread_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SESSIONS_SESSION_MONITOR_H_
