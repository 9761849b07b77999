// The state keeper process (state_keeper.h): one thread, poll(2), a map of
// names to descriptors.
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "proto/contract/session_socket.h"
#include "server/operations/instance_lock.h"
#include "server/state/keeper_protocol.h"
#include "server/state/state_keeper.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

// One log line (spdlog, as the daemon logs), `fmt` with one %s.
void Say(const char* fmt, const std::string& arg) {
  std::string text(fmt);
  const size_t at = text.find("%s");
  if (at != std::string::npos) text.replace(at, 2, arg);
  spdlog::info("state keeper (pid {}): {}", getpid(), text);
}

bool SendReply(int fd, KeeperKind kind, const std::string& name = "",
               uint64_t count = 0, int pass = -1) {
  KeeperRecord r{};
  r.magic = kKeeperMagic;
  r.kind = static_cast<uint32_t>(kind);
  r.count = count;
  std::strncpy(r.name, name.c_str(), sizeof(r.name) - 1);
  return SendRecord(fd, &r, sizeof(r), pass);
}

struct Keeper {
  std::string path;
  std::map<std::string, ScopedFd> held;
  bool discard = false;

  // One request of connection `fd`; false to drop the connection.
  bool Serve(int fd) {
    KeeperRecord r{};
    ReceivedRecord got = ReceiveRecord(fd, &r, sizeof(r), true);
    if (got.bytes == 0 || (got.bytes < 0 && errno != EAGAIN)) return false;
    if (got.bytes < 0) return true;
    if (got.bytes != static_cast<ssize_t>(sizeof(r)) || got.truncated ||
        r.magic != kKeeperMagic || got.more_fds.size() != 0) {
      SendReply(fd, KeeperKind::kError, "malformed record");
      return false;
    }
    const std::string name(r.name, strnlen(r.name, sizeof(r.name)));
    switch (static_cast<KeeperKind>(r.kind)) {
      case KeeperKind::kDeposit:
        if (got.fd.get() < 0 || name.empty()) {
          return SendReply(fd, KeeperKind::kError, "a deposit needs a name and a descriptor");
        }
        held[name] = std::move(got.fd);
        return SendReply(fd, KeeperKind::kDone);
      case KeeperKind::kRemove:
        held.erase(name);
        return SendReply(fd, KeeperKind::kDone);
      case KeeperKind::kCollect: {
        uint64_t sent = 0;
        for (const auto& [item, descriptor] : held) {
          if (!SendReply(fd, KeeperKind::kItem, item, 0, descriptor.get())) {
            return false;
          }
          ++sent;
        }
        return SendReply(fd, KeeperKind::kDone, "", sent);
      }
      case KeeperKind::kDiscard:
        held.clear();
        discard = true;
        // Before the answer: the daemon starts the next keeper on this path.
        unlink(path.c_str());
        SendReply(fd, KeeperKind::kDone);
        return false;
      default:
        SendReply(fd, KeeperKind::kError, "unknown request");
        return false;
    }
  }
};

}  // namespace

int RunStateKeeper(const std::string& path, absl::Duration keep_for) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    Say("bad socket path '%s'", path);
    return 2;
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  // Another keeper serving the path (one hostkvd started, while this one,
  // e.g. a container of its own, came up late) holds state: wait for it to
  // go rather than take its place. A socket file nobody answers on is a
  // dead keeper's.
  // A listener of another user is no keeper: it is not waited for.
  for (bool said = false;; said = true) {
    ScopedFd probe(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (ConnectWithin(probe.get(), path, absl::Seconds(5)) != 0) break;
    if (absl::Status peer = CheckKeeperPeer(probe.get(), path); !peer.ok()) {
      Say("%s", std::string(peer.message()));
      return 1;
    }
    if (!said) Say("another state keeper serves %s: waiting for it to exit", path);
    probe = ScopedFd();
    sleep(1);
  }
  unlink(path.c_str());
  ScopedFd listener(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  const mode_t old_umask = umask(0177);  // the socket is 0600
  const bool bound =
      listener.get() >= 0 &&
      bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      listen(listener.get(), 16) == 0;
  umask(old_umask);
  if (!bound) {
    Say("cannot listen on %s", path + ": " + std::strerror(errno));
    return 1;
  }
  struct stat mine {};
  stat(path.c_str(), &mine);
  Say("holding hostkvd's state on %s", path);
  Keeper keeper;
  keeper.path = path;
  std::vector<ScopedFd> clients;
  const int64_t keep_ms = absl::ToInt64Milliseconds(keep_for);
  int64_t alone_ms = 0;
  while (!keeper.discard) {
    std::vector<pollfd> fds;
    fds.push_back({listener.get(), POLLIN, 0});
    for (const ScopedFd& c : clients) fds.push_back({c.get(), POLLIN, 0});
    const int n = poll(fds.data(), fds.size(), 1000);
    if (n < 0 && errno != EINTR) break;
    // Gone or replaced: another keeper (or nobody) serves this path now.
    struct stat now {};
    if (stat(path.c_str(), &now) != 0 || now.st_ino != mine.st_ino ||
        now.st_dev != mine.st_dev) {
      Say("%s was removed or replaced: letting the state go", path);
      return 0;
    }
    if (n <= 0) {
      if (clients.empty() && (alone_ms += 1000) >= keep_ms) {
        Say("no hostkvd for the --state_keep_for period: letting the state go (%s)",
            path);
        unlink(path.c_str());
        return 0;
      }
      continue;
    }
    std::vector<ScopedFd> kept;
    for (size_t i = 1; i < fds.size() && !keeper.discard; ++i) {
      ScopedFd c = std::move(clients[i - 1]);
      const short ev = fds[i].revents;
      if (ev & POLLIN) {
        if (keeper.Serve(c.get())) kept.push_back(std::move(c));
      } else if ((ev & (POLLHUP | POLLERR)) == 0) {
        kept.push_back(std::move(c));
      }
    }
    clients = std::move(kept);
    if (fds[0].revents & POLLIN) {
      ScopedFd c(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      ucred peer{};
      socklen_t len = sizeof(peer);
      if (c.get() >= 0 &&
          getsockopt(c.get(), SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0 &&
          peer.uid == geteuid()) {
        clients.push_back(std::move(c));
      }
    }
    if (!clients.empty()) alone_ms = 0;
  }
  if (keeper.discard) Say("state discarded by hostkvd (%s)", path);
  return 0;
}

}  // namespace hostkv
