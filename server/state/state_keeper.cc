// The daemon's side of the state keeper: connecting (or starting one) and
// its requests.
#include "server/state/state_keeper.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/contract/session_socket.h"
#include "proto/contract/status_macros.h"
#include "server/operations/instance_lock.h"
#include "server/state/keeper_protocol.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

constexpr absl::Duration kConnectLimit = absl::Seconds(5);

absl::Status Errno(int err, const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}

}  // namespace

absl::Status CheckKeeperPeer(int connection, const std::string& path) {
  // The state is the daemon's own: only a keeper of its uid (or root's)
  // holds it. Anything else on the path is another user's listener.
  ucred peer{};
  socklen_t len = sizeof(peer);
  if (getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
    return Errno(errno, "SO_PEERCRED of " + path);
  }
  if (peer.uid == geteuid() || peer.uid == 0) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "what listens on the state keeper's socket ", path, " is pid ", peer.pid,
      " of uid ", peer.uid, ", not a keeper of hostkvd's uid ", geteuid(),
      " (or root): not trusted; remove ", path,
      " (another user's: its directory should not be writable by others)"));
}

namespace {

absl::StatusOr<ScopedFd> ConnectTo(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state keeper socket path too long: ", path));
  }
  ScopedFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Errno(errno, "socket");
  // A listener that never accepts (another user's) is not waited for.
  if (ConnectWithin(fd.get(), path, kConnectLimit) != 0) {
    return Errno(errno, "connect " + path);
  }
  RETURN_IF_ERROR(CheckKeeperPeer(fd.get(), path));
  return fd;
}

// Starts the keeper: this binary, in a grandchild in its own session, so
// that it outlives this process and is nobody's zombie.
absl::Status Spawn(const std::string& path, absl::Duration keep_for,
                   const std::vector<std::string>& args) {
  std::vector<std::string> strings = {
      "hostkvd", "--state_keeper=" + path,
      absl::StrCat("--state_keep_for=", absl::ToInt64Seconds(keep_for), "s")};
  strings.insert(strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t child = fork();
  if (child < 0) return Errno(errno, "fork (state keeper)");
  if (child == 0) {
    setsid();
    if (fork() != 0) _exit(0);
    // Nothing of the daemon's but its log: the instance lock above all.
    close_range(3, ~0u, 0);
    const int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
      dup2(null, 0);
      dup2(null, 1);
      // A pipe (a caller capturing the daemon's output, a container
      // runtime) would stay open as long as the keeper lives, and whoever
      // reads it would wait for the keeper: its few lines go nowhere then.
      // A file, a terminal or the journal's socket keeps them.
      struct stat err {};
      if (fstat(2, &err) == 0 && S_ISFIFO(err.st_mode)) dup2(null, 2);
      close(null);
    }
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateKeeper>> StateKeeper::Connect(
    const std::string& path, bool spawn, absl::Duration keep_for,
    const std::vector<std::string>& args) {
  absl::StatusOr<ScopedFd> fd = ConnectTo(path);
  if (!fd.ok() && spawn && absl::IsUnavailable(fd.status())) {
    // A socket file no keeper answers on is a dead keeper's. One this
    // process may not remove is another user's (a sticky directory).
    struct stat st {};
    if (unlink(path.c_str()) != 0 && errno != ENOENT &&
        lstat(path.c_str(), &st) == 0 && st.st_uid != geteuid()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "the state keeper's socket path ", path, " is taken by a file of uid ",
          st.st_uid, " that hostkvd (uid ", geteuid(),
          ") may not remove; remove it (its directory should not be writable "
          "by others)"));
    }
    if (absl::Status s = Spawn(path, keep_for, args); !s.ok()) return s;
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    do {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      fd = ConnectTo(path);
    } while (!fd.ok() && absl::Now() < deadline);
    if (fd.ok()) spdlog::info("state keeper started on {}", path);
  }
  if (!fd.ok()) return fd.status();
  ucred peer{};
  socklen_t len = sizeof(peer);
  getsockopt(fd->get(), SOL_SOCKET, SO_PEERCRED, &peer, &len);
  return std::unique_ptr<StateKeeper>(new StateKeeper(*std::move(fd), peer.pid));
}

absl::Status StateKeeper::Exchange(uint32_t kind, const std::string& name,
                                   int fd) {
  KeeperRecord request{};
  request.magic = kKeeperMagic;
  request.kind = kind;
  if (name.size() >= sizeof(request.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state keeper: name too long: ", name));
  }
  std::memcpy(request.name, name.data(), name.size());
  if (!SendRecord(socket_.get(), &request, sizeof(request), fd)) {
    return Errno(errno, "state keeper: send");
  }
  KeeperRecord reply{};
  ReceivedRecord got = ReceiveRecord(socket_.get(), &reply, sizeof(reply), false);
  if (got.bytes != static_cast<ssize_t>(sizeof(reply)) ||
      reply.magic != kKeeperMagic) {
    return absl::UnavailableError("state keeper: no answer (did it exit?)");
  }
  if (reply.kind != static_cast<uint32_t>(KeeperKind::kDone)) {
    return absl::InternalError(
        absl::StrCat("state keeper refused: ",
                     std::string(reply.name, strnlen(reply.name, sizeof(reply.name)))));
  }
  return absl::OkStatus();
}

absl::Status StateKeeper::Deposit(const std::string& name, int fd) {
  absl::MutexLock lock(&mu_);
  return Exchange(static_cast<uint32_t>(KeeperKind::kDeposit), name, fd);
}

absl::Status StateKeeper::Remove(const std::string& name) {
  absl::MutexLock lock(&mu_);
  return Exchange(static_cast<uint32_t>(KeeperKind::kRemove), name, -1);
}

absl::Status StateKeeper::Discard() {
  absl::MutexLock lock(&mu_);
  return Exchange(static_cast<uint32_t>(KeeperKind::kDiscard), "", -1);
}

absl::StatusOr<std::map<std::string, ScopedFd>> StateKeeper::Collect() {
  absl::MutexLock lock(&mu_);
  KeeperRecord request{};
  request.magic = kKeeperMagic;
  request.kind = static_cast<uint32_t>(KeeperKind::kCollect);
  if (!SendRecord(socket_.get(), &request, sizeof(request), -1)) {
    return Errno(errno, "state keeper: send");
  }
  std::map<std::string, ScopedFd> items;
  while (true) {
    KeeperRecord reply{};
    ReceivedRecord got =
        ReceiveRecord(socket_.get(), &reply, sizeof(reply), false);
    if (got.bytes != static_cast<ssize_t>(sizeof(reply)) ||
        reply.magic != kKeeperMagic) {
      return absl::UnavailableError("state keeper: the collection broke off");
    }
    if (reply.kind == static_cast<uint32_t>(KeeperKind::kDone)) break;
    if (reply.kind != static_cast<uint32_t>(KeeperKind::kItem) ||
        got.fd.get() < 0) {
      return absl::InternalError("state keeper: a malformed item");
    }
    items[std::string(reply.name, strnlen(reply.name, sizeof(reply.name)))] =
        std::move(got.fd);
  }
  return items;
}

}  // namespace hostkv
