#include "server/sessions/session_monitor.h"

#include <fcntl.h>
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
#include "server/operations/descriptor_shares.h"
#include "server/operations/instance_lock.h"
#include "spdlog/spdlog.h"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
#endif

namespace hostkv {
namespace {

// SO_PASSRIGHTS (Linux 6.16): 0 makes the kernel refuse SCM_RIGHTS sent to
// the socket (EPERM to the sender). Older headers lack the name.
constexpr int kSoPassRights = 83;

// Whether `listener` refuses descriptors (the kernel knows SO_PASSRIGHTS).
bool RefusesDescriptors(int listener) {
  int value = 1;
  socklen_t len = sizeof(value);
  return listener >= 0 &&
         getsockopt(listener, SOL_SOCKET, kSoPassRights, &value, &len) == 0 &&
         value == 0;
}

absl::StatusOr<ScopedFd> Listen(const std::string& path, mode_t mode,
                                gid_t gid) {
  ScopedFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", path));
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  // Accepted connections inherit it: every record then carries the
  // sender's credentials, taken by the kernel when it is sent.
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_PASSCRED, &one, sizeof(one));
  // And refuse descriptors (where the kernel can: Linux 6.16) until the
  // monitor allows them on a connection with a session.
  const int zero = 0;
  setsockopt(fd.get(), SOL_SOCKET, kSoPassRights, &zero, sizeof(zero));
  unlink(path.c_str());  // the instance lock guarantees it is ours
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd.get(), 128) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on ", path, ": ", std::strerror(errno)));
  }
  if (absl::Status s = SecureSocketPath(path, mode, gid); !s.ok()) return s;
  return fd;
}

SessionReply ReplyFor(SessionMessageKind kind, const absl::Status& status) {
  SessionReply reply{};
  reply.code = static_cast<uint32_t>(status.code());
  reply.kind = static_cast<uint32_t>(kind);
  std::strncpy(reply.message, std::string(status.message()).c_str(),
               sizeof(reply.message) - 1);
  return reply;
}

void Reply(int fd, const SessionReply& reply, int pass_fd = -1) {
  if (!SendRecord(fd, &reply, sizeof(reply), pass_fd)) {
    spdlog::debug("session socket: reply not sent: {}", std::strerror(errno));
  }
}

const char* KindName(SessionMessageKind kind) {
  switch (kind) {
    case SessionMessageKind::kOpen:
      return "kOpen";
    case SessionMessageKind::kAttach:
      return "kAttach";
    case SessionMessageKind::kResume:
      return "kResume";
    case SessionMessageKind::kPassFd:
      return "kPassFd";
    case SessionMessageKind::kFetchKvWord:
      return "kFetchKvWord";
    case SessionMessageKind::kFetchPoolSegment:
      return "kFetchPoolSegment";
  }
  return "unknown";
}

std::vector<uint32_t> PeerGroups(int fd) {
  std::vector<gid_t> groups(64);
  socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) {
    if (errno != ERANGE) return {};
    groups.resize(len / sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) {
      return {};
    }
  }
  groups.resize(len / sizeof(gid_t));
  return std::vector<uint32_t>(groups.begin(), groups.end());
}

}  // namespace

absl::StatusOr<std::unique_ptr<SessionMonitor>> SessionMonitor::Start(
    RequestHandler* handler, const std::string& socket_path, mode_t mode,
    gid_t gid, absl::Duration lease, ConnectionLimits limits) {
  ScopedFd listener;
  BoundPath bound;
  if (!socket_path.empty()) {
    absl::StatusOr<ScopedFd> fd = Listen(socket_path, mode, gid);
    if (!fd.ok()) return fd.status();
    listener = std::move(*fd);
    bound = IdentifyPath(socket_path);
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
  std::unique_ptr<SessionMonitor> monitor(new SessionMonitor(
      handler, socket_path, std::move(bound), lease, limits, std::move(listener),
      std::move(epoll), std::move(wake)));
  monitor->thread_ = std::thread([m = monitor.get()] { m->Loop(); });
  return monitor;
}

SessionMonitor::SessionMonitor(RequestHandler* handler, std::string socket_path,
                               BoundPath bound, absl::Duration lease, ConnectionLimits limits,
                               ScopedFd listener, ScopedFd epoll, ScopedFd wake)
    : handler_(handler),
      socket_path_(std::move(socket_path)),
      bound_(std::move(bound)),
      limits_(limits),
      listener_(std::move(listener)),
      epoll_(std::move(epoll)),
      wake_(std::move(wake)),
      reserve_(open("/dev/null", O_RDONLY | O_CLOEXEC)),
      ring_quota_(RingLimits{.max_rings = limits.max_command_rings,
                             .max_rings_per_uid =
                                 limits.max_command_rings_per_uid,
                             .cpu_per_uid = limits.ring_cpu_per_uid,
                             .spin = limits.command_ring_spin},
                  handler->budget()),
      rights_switch_(RefusesDescriptors(listener_.get())),
      closer_(limits.refused_fds),
      reaper_(handler, lease) {
  if (listener_.get() >= 0 && !rights_switch_) {
    spdlog::info("session socket: the kernel cannot refuse descriptors "
                 "(SO_PASSRIGHTS, Linux 6.16); refused ones are closed on "
                 "threads of their senders' uids");
  }
}

SessionMonitor::~SessionMonitor() {
  const uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof(one)) < 0) {
    spdlog::warn("session monitor: cannot wake: {}", std::strerror(errno));
  }
  thread_.join();
  for (const auto& [fd, c] : connections_) {
    CloseConnection(ScopedFd(fd), c.uid, c.rights_ever);
  }
  if (!socket_path_.empty()) UnlinkIfStillOurs(bound_);
}

size_t SessionMonitor::connections() const { return count_.load(); }

void SessionMonitor::Loop() {
  epoll_event events[64];
  absl::Time next_sweep = absl::Now() + absl::Seconds(1);
  while (true) {
    // Paused connections are looked at again every 50 ms.
    const int n = epoll_wait(epoll_.get(), events, 64, paused_ > 0 ? 50 : 1000);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_.get()) return;
      if (fd == listener_.get()) {
        Accept();
      } else if (!Serve(fd, events[i].events)) {
        Drop(fd);
      }
    }
    if (paused_ > 0) ResumePaused();
    if (absl::Now() >= next_sweep) {
      DropLate();
      next_sweep = absl::Now() + absl::Seconds(1);
    }
  }
}

void SessionMonitor::ShedOne() {
  // Out of descriptors: give up the spare one to accept the connection and
  // close it at once, so the backlog does not keep the listener readable
  // forever (and the client learns it was refused). Records sent before
  // the accept carry descriptors only where the kernel cannot refuse them:
  // then the closer closes it, on its uid's thread.
  reserve_ = ScopedFd();
  ScopedFd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (fd.get() >= 0) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len);
    shutdown(fd.get(), SHUT_RDWR);
    CloseConnection(std::move(fd), cred.uid, !rights_switch_);
  }
  reserve_ = ScopedFd(open("/dev/null", O_RDONLY | O_CLOEXEC));
  spdlog::warn("session socket: out of file descriptors; refused a connection "
               "({} open)", connections_.size());
}

void SessionMonitor::Accept() {
  while (true) {
    ScopedFd fd(accept4(listener_.get(), nullptr, nullptr,
                        SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (fd.get() < 0) {
      if (errno == EMFILE || errno == ENFILE) ShedOne();
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      CloseConnection(std::move(fd), static_cast<uid_t>(-1), !rights_switch_);
      continue;
    }
    absl::Status refused;
    uint32_t& of_uid = per_uid_[cred.uid];
    // Its connections the closer still closes count too.
    const size_t closing = closer_.connections(cred.uid);
    if (connections_.size() >= limits_.max_connections) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          connections_.size(), " session connections are open, the most "
          "--max_session_connections allows"));
    } else if (of_uid + closing >= limits_.max_connections_per_uid) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "uid ", cred.uid, " has ", of_uid + closing, " session connections "
          "open or closing, the most --max_session_connections_per_uid "
          "allows"));
    } else if (!MayTakeShared(of_uid + closing, connections_.size(),
                              limits_.max_connections)) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          connections_.size(), " session connections are open; the last of "
          "the ", limits_.max_connections, " the daemon takes are kept for "
          "users holding few, and uid ", cred.uid, " has ", of_uid + closing));
    }
    if (!refused.ok()) {
      if (of_uid == 0) per_uid_.erase(cred.uid);
      Refuse(std::move(fd), cred.uid, refused);
      continue;
    }
    ++of_uid;
    Connection c;
    c.uid = cred.uid;
    // Without SO_PASSRIGHTS, records with descriptors may be queued already.
    c.rights_ever = !rights_switch_;
    c.gid = cred.gid;
    c.groups = PeerGroups(fd.get());
    c.accepted = absl::Now();
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd.get();
    epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd.get(), &ev);
    connections_.emplace(fd.release(), std::move(c));
    count_.store(connections_.size());
  }
}

void SessionMonitor::Refuse(ScopedFd fd, uid_t uid, const absl::Status& why) {
  Reply(fd.get(), ReplyFor(SessionMessageKind::kOpen, why));
  spdlog::debug("session socket: {}", std::string(why.message()));
  CloseConnection(std::move(fd), uid, !rights_switch_);
}

bool SessionMonitor::Serve(int fd, uint32_t events) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return false;
  Connection& c = it->second;
  if (c.paused) return (events & (EPOLLHUP | EPOLLERR)) == 0;
  if (!MayRead(fd, c)) {
    // Its next record may carry more descriptors than its uid's closes
    // have room for: it waits in the connection, out of the daemon's
    // descriptor table, until they catch up.
    Pause(fd, c);
    return true;
  }
  SessionMessage m{};
  ReceivedRecord got = ReceiveRecord(fd, &m, sizeof(m), /*dont_wait=*/true);
  if (got.bytes < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
  const auto kind = static_cast<SessionMessageKind>(m.kind);
  // Descriptors before anything else: the one the protocol takes is kept,
  // every other one is disposed of now, whatever else is wrong with the
  // record.
  absl::Status refused;
  ScopedFd memfd = TakeMemfd(c, kind, got, &refused);
  if (got.bytes <= 0) return false;  // closed: the client is gone
  if (got.bytes != sizeof(m) || got.truncated || m.magic != kSessionMagic ||
      m.version != kSessionProtocolVersion) {
    Reply(fd, ReplyFor(kind, absl::InvalidArgumentError(absl::StrCat(
                                 "malformed session record (want ", sizeof(m),
                                 "-byte version ", kSessionProtocolVersion,
                                 " records)"))));
    return false;
  }
  // The kernel's credentials of the process that sent this record: a
  // connection handed to a process of another user is refused, not
  // attached as its creator.
  if (!got.has_credentials || got.uid != c.uid) {
    Reply(fd, ReplyFor(kind, absl::PermissionDeniedError(
                                 "the record was sent by another user than "
                                 "the one who connected")));
    spdlog::warn("session socket: a connection of uid {} sent a record as uid "
                 "{}; closed",
                 c.uid, got.has_credentials ? static_cast<int64_t>(got.uid) : -1);
    return false;
  }
  if (!refused.ok()) {
    Reply(fd, ReplyFor(kind, refused));
    return true;
  }
  PeerCredentials sender{static_cast<uint32_t>(got.pid), got.uid, got.gid,
                         c.groups};
  return Handle(fd, c, m, sender, std::move(memfd));
}

ScopedFd SessionMonitor::TakeMemfd(Connection& c, SessionMessageKind kind,
                                   ReceivedRecord& got, absl::Status* refused) {
  const size_t count = got.fd_count();
  if (count == 0) return ScopedFd();
  // A memfd (or another shmem/hugetlbfs file: F_GET_SEALS works) alone with
  // a whole kPassFd record. RequestHandler::AcceptPassedFd checks its seals.
  if (kind == SessionMessageKind::kPassFd && count == 1 &&
      got.bytes == static_cast<ssize_t>(sizeof(SessionMessage)) &&
      KindOfDescriptor(got.fd.get()) == DescriptorKind::kMemfd) {
    return std::move(got.fd);
  }
  // The first descriptor that is not a memfd names the refusal.
  int named = got.fd.get();
  for (const ScopedFd& more : got.more_fds) {
    if (KindOfDescriptor(named) != DescriptorKind::kMemfd) break;
    named = more.get();
  }
  const std::string what = DescribeDescriptor(named);
  if (kind != SessionMessageKind::kPassFd) {
    *refused = absl::InvalidArgumentError(absl::StrCat(
        "a ", KindName(kind), " record carries no descriptor; got ",
        count == 1 ? "a " : absl::StrCat(count, " descriptors, one a "),
        what));
  } else if (count > 1) {
    *refused = absl::InvalidArgumentError(absl::StrCat(
        "kPassFd takes exactly one descriptor, a memfd; got ", count));
  } else {
    *refused = absl::InvalidArgumentError(absl::StrCat(
        "kPassFd takes a memfd (memfd_create with MFD_ALLOW_SEALING); got a ",
        what));
  }
  if (!c.refused_descriptor) {
    c.refused_descriptor = true;
    spdlog::warn("session socket: uid {} passed {} descriptor(s) with a {} "
                 "record, refused: {} (not logged again for this connection)",
                 c.uid, count, KindName(kind), what);
  }
  closer_.Dispose(c.uid, std::move(got.fd));
  for (ScopedFd& more : got.more_fds) closer_.Dispose(c.uid, std::move(more));
  got.more_fds.clear();
  return ScopedFd();
}

bool SessionMonitor::Handle(int fd, Connection& c, const SessionMessage& m,
                            const PeerCredentials& sender, ScopedFd passed) {
  const auto kind = static_cast<SessionMessageKind>(m.kind);
  if (kind == SessionMessageKind::kPassFd) {
    absl::StatusOr<uint64_t> handle =
        c.session.empty()
            ? absl::FailedPreconditionError("open or attach a session first")
        : passed.get() < 0
            ? absl::InvalidArgumentError("kPassFd carries no descriptor")
            : handler_->AcceptPassedFd(c.session, sender, std::move(passed),
                                       m.import_id);
    SessionReply reply = ReplyFor(kind, handle.status());
    if (handle.ok()) reply.value = *handle;
    Reply(fd, reply);
    return true;
  }
  if (kind == SessionMessageKind::kFetchKvWord) {
    absl::StatusOr<ScopedFd> page =
        c.session.empty()
            ? absl::FailedPreconditionError("open or attach a session first")
            : handler_->FetchKvWord(c.session, sender, m.import_id);
    Reply(fd, ReplyFor(kind, page.status()), page.ok() ? page->get() : -1);
    return true;
  }
  if (kind == SessionMessageKind::kFetchPoolSegment) {
    char pool[sizeof(m.client_name) + 1] = {};
    std::memcpy(pool, m.client_name, sizeof(m.client_name));
    absl::StatusOr<PoolSegmentFd> segment =
        c.session.empty()
            ? absl::FailedPreconditionError("open or attach a session first")
            : handler_->FetchPoolSegment(c.session, sender, pool);
    SessionReply reply = ReplyFor(kind, segment.status());
    if (segment.ok()) reply.value = segment->writable ? 1 : 0;
    Reply(fd, reply, segment.ok() ? segment->fd.get() : -1);
    return true;
  }
  if (kind == SessionMessageKind::kOpenCommandRing) {
    OpenCommandRing(fd, c);
    return true;
  }
  if (kind != SessionMessageKind::kOpen && kind != SessionMessageKind::kAttach &&
      kind != SessionMessageKind::kResume) {
    Reply(fd, ReplyFor(kind, absl::InvalidArgumentError(
                                 absl::StrCat("unknown record kind ", m.kind))));
    return false;
  }
  if (!c.session.empty()) {
    Reply(fd, ReplyFor(kind, absl::FailedPreconditionError(
                                 "this connection has a session already")));
    return true;
  }
  absl::StatusOr<AttachedSession> attached = absl::UnknownError("");
  if (kind == SessionMessageKind::kOpen) {
    char name[sizeof(m.client_name) + 1] = {};
    std::memcpy(name, m.client_name, sizeof(m.client_name));
    attached = handler_->OpenAttachedSession(name, sender);
  } else if (kind == SessionMessageKind::kResume) {
    attached = handler_->ResumeSession(
        SessionId(reinterpret_cast<const char*>(m.session_id), kSessionIdBytes),
        sender);
  } else {
    attached = handler_->AttachSession(
        SessionId(reinterpret_cast<const char*>(m.session_id), kSessionIdBytes),
        sender);
  }
  SessionReply reply = ReplyFor(kind, attached.status());
  if (!attached.ok()) {
    Reply(fd, reply);
    return false;
  }
  const Session& session = *attached->session;
  std::memcpy(reply.session_id, session.id().data(), kSessionIdBytes);
  reply.session_number = session.tag();
  reply.signal_slots = session.signals()->records();
  reply.value = session.signals()->id();
  reply.lease_seconds = 0;  // lives as long as the connection
  reply.features = kSessionFeatureCommandRing | kSessionFeatureRingListEvictions;
  c.session = session.id();
  MayRead(fd, c);  // descriptors may come now, its kPassFd records
  Reply(fd, reply, attached->signal_fd.get());
  return true;
}

void SessionMonitor::OpenCommandRing(int fd, Connection& c) {
  const auto kind = SessionMessageKind::kOpenCommandRing;
  if (c.session.empty()) {
    Reply(fd, ReplyFor(kind, absl::FailedPreconditionError(
                                 "open or attach a session first")));
    return;
  }
  if (c.ring == nullptr) {
    // The grant counts the ring (to the daemon and to its uid) until its
    // thread ends, retiring or not.
    absl::StatusOr<RingGrant> grant = ring_quota_.Grant(
        c.uid, RingSegmentBytes(kRingSlots, kRingSlotBytes));
    if (!grant.ok()) {
      Reply(fd, ReplyFor(kind, grant.status()));
      return;
    }
    absl::StatusOr<std::unique_ptr<RingServer>> ring = RingServer::Start(
        handler_, c.session, std::move(*grant), limits_.command_ring_spin);
    if (!ring.ok()) {
      spdlog::warn("session socket: cannot start a command ring: {}",
                   ring.status().ToString());
      Reply(fd, ReplyFor(kind, ring.status()));
      return;
    }
    c.ring = std::move(*ring);
    std::shared_ptr<RingThreads> threads = ring_quota_.threads_of(c.uid);
    spdlog::info("session socket: a command ring for uid {} ({} of its own "
                 "served by {} threads, {} in all)",
                 c.uid, ring_quota_.rings_of(c.uid),
                 threads != nullptr ? threads->threads() : 0,
                 ring_quota_.rings());
  }
  absl::StatusOr<ScopedFd> ring_fd = c.ring->ClientFd();
  SessionReply reply = ReplyFor(kind, ring_fd.status());
  if (ring_fd.ok()) reply.value = c.ring->size();
  Reply(fd, reply, ring_fd.ok() ? ring_fd->get() : -1);
}

void SessionMonitor::Drop(int fd) {
  auto it = connections_.find(fd);
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  if (it == connections_.end()) {
    CloseConnection(ScopedFd(fd), static_cast<uid_t>(-1), true);
    return;
  }
  CloseConnection(ScopedFd(fd), it->second.uid, it->second.rights_ever);
  if (it->second.paused) --paused_;
  SessionId session = std::move(it->second.session);
  auto uid = per_uid_.find(it->second.uid);
  if (uid != per_uid_.end() && --uid->second == 0) per_uid_.erase(uid);
  if (it->second.ring != nullptr) {
    // Its thread may be in a call (a Lookup waiting for the tier): it ends
    // after it, without holding up this loop.
    it->second.ring->Stop();
    retiring_rings_.push_back(std::move(it->second.ring));
  }
  connections_.erase(it);
  count_.store(connections_.size());
  if (!session.empty()) reaper_.End(std::move(session), "disconnected");
}

void SessionMonitor::DropLate() {
  std::erase_if(retiring_rings_, [](const std::unique_ptr<RingServer>& ring) {
    return ring->ended();
  });
  const absl::Time cutoff = absl::Now() - limits_.attach_timeout;
  std::vector<int> late;
  for (const auto& [fd, c] : connections_) {
    if (c.session.empty() && c.accepted < cutoff) late.push_back(fd);
  }
  for (int fd : late) {
    Reply(fd, ReplyFor(SessionMessageKind::kOpen,
                       absl::DeadlineExceededError(
                           "no session was opened or attached within "
                           "--attach_timeout")));
    Drop(fd);
  }
  if (!late.empty()) {
    spdlog::info("session socket: closed {} connections that did not attach "
                 "in time",
                 late.size());
  }
}

}  // namespace hostkv
