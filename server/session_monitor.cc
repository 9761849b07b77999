#include "server/session_monitor.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/contract/session_attach.h"
#include "server/instance_lock.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

absl::StatusOr<ScopedFd> Listen(const std::string& path, mode_t mode,
                                gid_t gid) {
  ScopedFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", path));
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  unlink(path.c_str());  // the instance lock guarantees it is ours
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd.get(), 128) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on ", path, ": ", std::strerror(errno)));
  }
  if (absl::Status s = SecureSocketPath(path, mode, gid); !s.ok()) return s;
  return fd;
}

void Reply(int fd, const absl::Status& status) {
  SessionAttachReply reply{};
  reply.code = static_cast<uint32_t>(status.code());
  std::strncpy(reply.message, std::string(status.message()).c_str(),
               sizeof(reply.message) - 1);
  send(fd, &reply, sizeof(reply), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SessionMonitor>> SessionMonitor::Start(
    RequestHandler* handler, const std::string& socket_path, mode_t mode,
    gid_t gid, absl::Duration lease) {
  ScopedFd listener;
  if (!socket_path.empty()) {
    absl::StatusOr<ScopedFd> fd = Listen(socket_path, mode, gid);
    if (!fd.ok()) return fd.status();
    listener = std::move(*fd);
  }
  ScopedFd epoll(epoll_create1(EPOLL_CLOEXEC));
  ScopedFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (epoll.get() < 0 || wake.get() < 0) {
    return absl::InternalError(absl::StrCat("epoll/eventfd: ", std::strerror(errno)));
  }
  for (int fd : {listener.get(), wake.get()}) {
    if (fd < 0) continue;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &ev);
  }
  std::unique_ptr<SessionMonitor> monitor(
      new SessionMonitor(handler, socket_path, lease, std::move(listener),
                         std::move(epoll), std::move(wake)));
  monitor->thread_ = std::thread([m = monitor.get()] { m->Loop(); });
  return monitor;
}

SessionMonitor::SessionMonitor(RequestHandler* handler, std::string socket_path,
                               absl::Duration lease, ScopedFd listener,
                               ScopedFd epoll, ScopedFd wake)
    : handler_(handler),
      socket_path_(std::move(socket_path)),
      lease_(lease),
      listener_(std::move(listener)),
      epoll_(std::move(epoll)),
      wake_(std::move(wake)) {}

SessionMonitor::~SessionMonitor() {
  const uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof(one)) < 0) {
    spdlog::warn("session monitor: cannot wake: {}", std::strerror(errno));
  }
  thread_.join();
  for (const auto& [fd, id] : connections_) close(fd);
  if (!socket_path_.empty()) unlink(socket_path_.c_str());
}

void SessionMonitor::Loop() {
  epoll_event events[64];
  absl::Time next_sweep = absl::Now() + absl::Seconds(1);
  while (true) {
    const int n = epoll_wait(epoll_.get(), events, 64, 1000);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_.get()) return;
      if (fd == listener_.get()) {
        Accept();
      } else if (!Serve(fd)) {
        Drop(fd);
      }
    }
    if (absl::Now() >= next_sweep) {
      handler_->ExpireIdleSessions(lease_);
      next_sweep = absl::Now() + absl::Seconds(1);
    }
  }
}

void SessionMonitor::Accept() {
  while (true) {
    const int fd = accept4(listener_.get(), nullptr, nullptr,
                           SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
    connections_[fd] = 0;
  }
}

bool SessionMonitor::Serve(int fd) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return false;
  SessionAttach attach{};
  const ssize_t got = recv(fd, &attach, sizeof(attach), MSG_DONTWAIT);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
  if (got <= 0) return false;  // closed: the client is gone
  if (it->second != 0) {
    Reply(fd, absl::FailedPreconditionError("the session is already attached"));
    return true;
  }
  if (got != sizeof(attach) || attach.magic != kSessionAttachMagic ||
      attach.version != 1) {
    Reply(fd, absl::InvalidArgumentError("malformed SessionAttach record"));
    return false;
  }
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    Reply(fd, absl::InternalError("cannot read the peer's credentials"));
    return false;
  }
  const absl::Status status = handler_->AttachSession(
      attach.session_id, PeerCredentials{static_cast<uint32_t>(cred.pid),
                                         cred.uid, cred.gid});
  Reply(fd, status);
  if (!status.ok()) return false;
  it->second = attach.session_id;
  return true;
}

void SessionMonitor::Drop(int fd) {
  auto it = connections_.find(fd);
  const uint64_t session = it == connections_.end() ? 0 : it->second;
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  if (it != connections_.end()) connections_.erase(it);
  // NotFound when the client closed the session itself first: nothing to do.
  if (session != 0) handler_->EndSession(session, "disconnected").IgnoreError();
}

}  // namespace hostkv
