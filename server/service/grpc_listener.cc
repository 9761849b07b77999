#include "server/service/grpc_listener.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/operations/instance_lock.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

absl::StatusOr<ScopedFd> ListenUnix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path is empty or longer than ", sizeof(addr.sun_path) - 1,
        " bytes: ", path));
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ScopedFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.get() < 0) {
    return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  unlink(path.c_str());  // the instance lock guarantees it is ours
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd.get(), SOMAXCONN) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on ", path, ": ", std::strerror(errno)));
  }
  return fd;
}

// "HOST:PORT" or "[V6]:PORT".
absl::StatusOr<ScopedFd> ListenTcp(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("not HOST:PORT: ", address));
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  uint32_t port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad port in ", address));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(),
                           &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", address, ": ", gai_strerror(rc)));
  }
  std::string why = "no address";
  ScopedFd bound;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    ScopedFd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                       a->ai_protocol));
    if (fd.get() < 0) continue;
    const int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 &&
        listen(fd.get(), SOMAXCONN) == 0) {
      bound = std::move(fd);
      break;
    }
    why = std::strerror(errno);
  }
  freeaddrinfo(found);
  if (bound.get() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on ", address, ": ", why));
  }
  return bound;
}

uint64_t NowNs() {
  return static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcListener>> GrpcListener::Listen(
    const std::string& listen, uint32_t max_connections_per_uid,
    uint32_t max_connections) {
  const bool unix_socket = absl::StartsWith(listen, "unix:");
  const std::string path = unix_socket ? listen.substr(5) : "";
  absl::StatusOr<ScopedFd> fd =
      unix_socket ? ListenUnix(path) : ListenTcp(listen);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<GrpcListener>(new GrpcListener(
      std::move(*fd), path, unix_socket, max_connections_per_uid,
      max_connections));
}

GrpcListener::GrpcListener(ScopedFd listener, std::string path,
                           bool unix_socket, uint32_t max_connections_per_uid,
                           uint32_t max_connections)
    : listener_(std::move(listener)),
      wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      reserve_(open("/dev/null", O_RDONLY | O_CLOEXEC)),
      path_(std::move(path)),
      unix_socket_(unix_socket),
      peers_(max_connections_per_uid, max_connections),
      bound_(unix_socket_ ? IdentifyPath(path_) : BoundPath{}) {}

GrpcListener::~GrpcListener() { Stop(); }

void GrpcListener::Serve(grpc::Server* server) {
  thread_ = std::thread([this, server] { Run(server); });
}

void GrpcListener::Stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    if (write(wake_.get(), &one, sizeof(one)) < 0) {
      spdlog::debug("gRPC listener: wake: {}", std::strerror(errno));
    }
    thread_.join();
  }
  if (listener_.get() >= 0) {
    listener_ = ScopedFd();
    if (unix_socket_) UnlinkIfStillOurs(bound_);
  }
}

GrpcListenerStats GrpcListener::stats() const {
  return GrpcListenerStats{accepted_.load(), shed_.load(),
                           over_uid_bound_.load()};
}

void GrpcListener::Run(grpc::Server* server) {
  pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("gRPC listener: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    // Each accept4 takes one waiting connection; the loop empties the
    // backlog before polling again.
    while (true) {
      ScopedFd fd(accept4(listener_.get(), nullptr, nullptr,
                          SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (fd.get() >= 0) {
        HandOver(server, std::move(fd));
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        if (ShedOne()) continue;
      }
      break;  // EAGAIN: nothing waits (or nothing could be shed)
    }
  }
}

void GrpcListener::HandOver(grpc::Server* server, ScopedFd fd) {
  if (unix_socket_) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return;
    const PeerConnections::Admission admission =
        peers_.Admit(cred.uid, fd.get());
    if (admission != PeerConnections::Admission::kAdmitted) {
      ++over_uid_bound_;
      const uint64_t now = NowNs();
      if (now - last_warning_ns_ > 1'000'000'000) {
        last_warning_ns_ = now;
        if (admission == PeerConnections::Admission::kOverTotal) {
          spdlog::warn("gRPC: {} connections are open, and the last of the {} "
                       "the descriptor limit leaves for them are kept for "
                       "users holding few; closed a new one of uid {} (pid "
                       "{}) ({} closed so far)",
                       peers_.held(), peers_.max_total(), cred.uid, cred.pid,
                       over_uid_bound_.load());
        } else {
          spdlog::warn("gRPC: uid {} (pid {}) holds {} connections "
                       "(--max_grpc_connections_per_uid={}); closed its new "
                       "one ({} closed so far)",
                       cred.uid, cred.pid, peers_.max_per_uid(),
                       peers_.max_per_uid(), over_uid_bound_.load());
        }
      }
      return;
    }
  } else {
    const int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ++accepted_;
  grpc::AddInsecureChannelFromFd(server, fd.release());
}

bool GrpcListener::ShedOne() {
  // Out of descriptors: give up the spare one to accept the connection and
  // close it at once, so that it does not wait in the backlog (its client
  // learns it was refused). Without a spare (something took it meanwhile),
  // wait a moment for descriptors to be freed rather than spin.
  reserve_ = ScopedFd();
  ScopedFd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  const bool taken = fd.get() >= 0;
  fd = ScopedFd();
  reserve_ = ScopedFd(open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (taken) ++shed_;
  const uint64_t now = NowNs();
  if (taken && now - last_warning_ns_ > 1'000'000'000) {
    last_warning_ns_ = now;
    spdlog::warn("gRPC: out of file descriptors; closed a new connection at "
                 "once ({} so far); serving again as soon as some are free",
                 shed_.load());
  }
  if (!taken || reserve_.get() < 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return taken;
}

}  // namespace hostkv
