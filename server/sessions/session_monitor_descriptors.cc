// SessionMonitor: when descriptors may reach the daemon on a connection,
// and how connections that may hold some are closed.
#include <sys/epoll.h>
#include <sys/socket.h>

#include <utility>

#include "proto/contract/session_socket.h"
#include "server/sessions/session_monitor.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

constexpr int kSoPassRights = 83;  // SO_PASSRIGHTS (Linux 6.16)

}  // namespace

bool SessionMonitor::MayRead(int fd, Connection& c) {
  const bool room = closer_.Headroom(c.uid) >= kMaxRecordFds;
  const bool allow = room && !c.session.empty();
  if (allow != c.rights) AllowDescriptors(fd, c, allow);
  // A connection that never took descriptors has none queued.
  return room || !c.rights_ever;
}

bool SessionMonitor::AllowDescriptors(int fd, Connection& c, bool allow) {
  if (!rights_switch_) return false;
  const int value = allow ? 1 : 0;
  if (setsockopt(fd, SOL_SOCKET, kSoPassRights, &value, sizeof(value)) != 0) {
    return false;
  }
  c.rights = allow;
  if (allow) c.rights_ever = true;
  return true;
}

void SessionMonitor::Pause(int fd, Connection& c) {
  if (c.paused) return;
  // No events asked: a hang-up or error still comes (and drops it).
  epoll_event ev{};
  ev.events = 0;
  ev.data.fd = fd;
  epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev);
  c.paused = true;
  ++paused_;
  spdlog::debug(
      "session socket: a connection of uid {} waits for {} refused "
      "descriptors of its uid to be closed",
      c.uid, closer_.pending(c.uid));
}

void SessionMonitor::ResumePaused() {
  for (auto& [fd, c] : connections_) {
    if (!c.paused || !MayRead(fd, c)) continue;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev);
    c.paused = false;
    --paused_;
  }
}

void SessionMonitor::CloseConnection(ScopedFd fd, uid_t uid,
                                     bool may_hold_descriptors) {
  // Nothing queued in it can hold a descriptor: closing it here releases
  // nothing of the client's.
  if (!may_hold_descriptors) return;
  closer_.CloseConnection(uid, std::move(fd));
}

}  // namespace hostkv
