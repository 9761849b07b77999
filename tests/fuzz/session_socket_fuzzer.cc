// libFuzzer target over the session socket itself: a real SessionMonitor
// (hostkvd's `<socket>.session`, server/sessions/session_monitor.h) on a
// socket of its own, with small bounds, and connections of this process
// that the input scripts: connect, send a record (any kind and fields, most
// of them well formed) carrying 0-253 descriptors of several kinds (pipe
// ends, sealed and unsealed memfds, sockets), read what comes back, close.
// request_fuzzer drives the handlers behind it; this one reaches what only
// the socket has: --max_session_connections(_per_uid), the refused
// descriptors' queue and its per-uid bound, records cut short, rings.
//
// Checked: nothing crashes (ASan/UBSan); the monitor never holds more
// connections than its bounds; once the input's connections are closed the
// monitor holds none, every session they opened has ended, and this
// process' descriptors are back where they were (every refused descriptor
// was closed, none leaked). tests/fuzz/run_fuzzer.sh runs it after
// request_fuzzer.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fuzzer/FuzzedDataProvider.h>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/contract/session_socket.h"
#include "server/pool/memory_budget.h"
#include "server/pool/pool_registry.h"
#include "server/service/request_handler.h"
#include "server/sessions/session_monitor.h"
#include "server/sessions/session_registry.h"
#include "server/transfer/transfer_engine.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_model.h"

namespace hostkv::fuzz {
namespace {

constexpr uint32_t kMaxConnections = 6;
constexpr uint32_t kMaxConnectionsPerUid = 4;  // all of this process' own
constexpr size_t kClientConnections = 8;       // some are refused
constexpr int kMaxOps = 24;

// What the inputs did (HOSTKV_FUZZ_STATS=1 prints it at exit).
struct Stats {
  uint64_t connects = 0, records = 0, descriptors = 0, replies = 0,
           closed_by_daemon = 0;
  ~Stats() {
    if (std::getenv("HOSTKV_FUZZ_STATS") == nullptr) return;
    std::fprintf(stderr,
                 "connections %lu, records %lu with %lu descriptors, replies "
                 "%lu, connections the daemon closed %lu\n",
                 static_cast<unsigned long>(connects),
                 static_cast<unsigned long>(records),
                 static_cast<unsigned long>(descriptors),
                 static_cast<unsigned long>(replies),
                 static_cast<unsigned long>(closed_by_daemon));
  }
};
Stats stats;

ConnectionLimits MonitorLimits() {
  ConnectionLimits limits;
  limits.max_connections = kMaxConnections;
  limits.max_connections_per_uid = kMaxConnectionsPerUid;
  limits.attach_timeout = absl::Seconds(2);
  limits.max_command_rings = 2;
  limits.max_command_rings_per_uid = 1;
  limits.ring_cpu_per_uid = 0.5;
  limits.command_ring_spin = absl::ZeroDuration();
  // Room for two records' descriptors per uid, three in all.
  limits.refused_fds.max_per_uid = 2 * (kMaxRecordFds + 1);
  limits.refused_fds.max_total = 3 * (kMaxRecordFds + 1);
  return limits;
}

// What /proc/self/fd shows, for the report.
std::string DescribeDescriptors() {
  std::string all;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return all;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    char target[256] = {};
    const std::string link = absl::StrCat("/proc/self/fd/", e->d_name);
    if (readlink(link.c_str(), target, sizeof(target) - 1) < 0) continue;
    absl::StrAppend(&all, " ", e->d_name, "=", target);
  }
  closedir(dir);
  return all;
}

int OpenDescriptors() {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) Die("cannot list /proc/self/fd");
  while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n - 1;  // the directory's own
}

// hostkvd's session-socket side, built once.
struct Daemon {
  Daemon()
      : prefix(absl::StrCat("/hostkv-sfuzz.", getpid(), ".")),
        dir(absl::StrCat("/tmp/hostkv-sfuzz.", getpid())),
        budget(kBudgetBytes, 0, [] { return uint64_t{1} << 40; }),
        pools(&budget, prefix, PoolFillOptions{1}, /*gpu=*/nullptr,
              MakePoolQuota()),
        sessions(prefix, kSignalRecords, MakeSessionLimits(), &budget),
        transfers(1, /*metrics=*/nullptr),
        handler(MakeLimits(prefix), &budget, &pools, &sessions, &transfers) {
    mkdir(dir.c_str(), 0700);
    socket_path = dir + "/hostkvd.sock" + kSessionSocketSuffix;
    auto started = SessionMonitor::Start(&handler, socket_path, 0600, -1,
                                         absl::Seconds(30), MonitorLimits());
    FUZZ_CHECK(started.ok(), started.status().ToString());
    monitor = std::move(*started);
  }

  std::string prefix;
  std::string dir;
  std::string socket_path;  // the session socket's
  MemoryBudget budget;
  PoolRegistry pools;
  SessionRegistry sessions;
  TransferEngine transfers;
  RequestHandler handler;
  std::unique_ptr<SessionMonitor> monitor;
};

Daemon& TheDaemon() {
  static Daemon* daemon = new Daemon();  // lives as long as the process
  return *daemon;
}

ScopedFd Connect(const std::string& socket_path) {
  ScopedFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ScopedFd();
  }
  return fd;
}

// Descriptors of the kinds a client could pass: `count` of kind `kind`.
std::vector<ScopedFd> MakeDescriptors(int kind, size_t count) {
  std::vector<ScopedFd> fds;
  int ends[2];
  for (size_t i = 0; i < count; ++i) {
    switch (kind) {
      case 0:  // pipe ends
        if (pipe2(ends, O_CLOEXEC) != 0) return fds;
        fds.emplace_back(ends[0]);
        close(ends[1]);
        break;
      case 1:  // sealed memfds: the one kPassFd takes
      case 2: {  // unsealed memfds
        ScopedFd fd(memfd_create("sfuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING));
        if (fd.get() < 0 || ftruncate(fd.get(), 4096) != 0) return fds;
        if (kind == 1) fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK);
        fds.push_back(std::move(fd));
        break;
      }
      default:  // a socket (with its peer closed)
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) {
          return fds;
        }
        fds.emplace_back(ends[0]);
        close(ends[1]);
        break;
    }
  }
  return fds;
}

// Sends `m` (its first `length` bytes) with `fds`; false if it could not.
bool Send(int conn, const SessionMessage& m, size_t length,
          const std::vector<ScopedFd>& fds) {
  iovec iov{const_cast<SessionMessage*>(&m), length};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(fds.size() * sizeof(int)));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    for (size_t i = 0; i < fds.size(); ++i) {
      const int fd = fds[i].get();
      std::memcpy(CMSG_DATA(c) + i * sizeof(int), &fd, sizeof(int));
    }
  }
  return sendmsg(conn, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0;
}

// Reads what `conn` has within `wait` (replies, with descriptors, closed
// here); false once the daemon closed it.
bool Drain(int conn, absl::Duration wait) {
  pollfd p{conn, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) <= 0) {
    return true;
  }
  while (true) {
    SessionReply reply{};
    ReceivedRecord got = ReceiveRecord(conn, &reply, sizeof(reply),
                                       /*dont_wait=*/true);
    if (got.bytes == 0) {
      ++stats.closed_by_daemon;
      return false;
    }
    if (got.bytes < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    ++stats.replies;
  }
}

// Waits up to 5 s for `done`.
template <typename Done>
bool Eventually(Done done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

void RunOne(const uint8_t* data, size_t size) {
  Daemon& d = TheDaemon();
  // Per input: between inputs libFuzzer may start a symbolizer (pipes to
  // it) to name newly covered functions.
  const int baseline = OpenDescriptors();
  FuzzedDataProvider fdp(data, size);
  std::vector<ScopedFd> conns;
  for (int op = 0; op < kMaxOps && fdp.remaining_bytes() > 0; ++op) {
    switch (fdp.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
        if (conns.size() < kClientConnections) {
          ScopedFd c = Connect(d.socket_path);
          if (c.get() >= 0) {
            ++stats.connects;
            conns.push_back(std::move(c));
          }
        }
        break;
      case 1: {  // a record
        if (conns.empty()) break;
        const size_t i = fdp.ConsumeIntegralInRange<size_t>(0, conns.size() - 1);
        SessionMessage m = NewSessionMessage(
            static_cast<SessionMessageKind>(fdp.ConsumeIntegralInRange<uint32_t>(1, 10)),
            "sfuzz");
        if (fdp.ConsumeBool()) m.kind = fdp.ConsumeIntegral<uint32_t>();
        if (fdp.ConsumeIntegralInRange<int>(0, 7) == 0) {
          m.magic ^= fdp.ConsumeIntegral<uint32_t>();
          m.version = fdp.ConsumeIntegral<uint32_t>();
        }
        if (fdp.ConsumeBool()) {
          const std::string id = fdp.ConsumeBytesAsString(kSessionIdBytes);
          std::memcpy(m.session_id, id.data(), id.size());
        }
        if (fdp.ConsumeBool()) {
          const std::string name = fdp.ConsumeBytesAsString(sizeof(m.client_name));
          std::memcpy(m.client_name, name.data(), name.size());  // NUL or not
        }
        m.import_id = fdp.ConsumeBool() ? fdp.ConsumeIntegral<uint64_t>() : 0;
        const size_t length = fdp.ConsumeBool()
                                  ? sizeof(m)
                                  : fdp.ConsumeIntegralInRange<size_t>(1, sizeof(m));
        // Mostly none or one descriptor; now and then a full record's.
        size_t count = fdp.ConsumeIntegralInRange<size_t>(0, 3);
        if (count == 3) count = fdp.ConsumeIntegralInRange<size_t>(2, kMaxRecordFds);
        const std::vector<ScopedFd> fds =
            MakeDescriptors(fdp.ConsumeIntegralInRange<int>(0, 3), count);
        ++stats.records;
        stats.descriptors += fds.size();
        if (!Send(conns[i].get(), m, length, fds) ||
            !Drain(conns[i].get(), absl::Milliseconds(50))) {
          conns.erase(conns.begin() + static_cast<long>(i));
        }
        break;
      }
      case 2:  // a client closes
        if (!conns.empty()) {
          conns.erase(conns.begin() + static_cast<long>(
                                          fdp.ConsumeIntegralInRange<size_t>(
                                              0, conns.size() - 1)));
        }
        break;
      default:  // reads what came
        for (size_t i = 0; i < conns.size();) {
          if (Drain(conns[i].get(), absl::ZeroDuration())) {
            ++i;
          } else {
            conns.erase(conns.begin() + static_cast<long>(i));
          }
        }
        break;
    }
    FUZZ_CHECK(d.monitor->connections() <= kMaxConnections,
               d.monitor->connections(), " connections held");
  }
  conns.clear();
  FUZZ_CHECK(Eventually([&] { return d.monitor->connections() == 0; }),
             d.monitor->connections(), " connections still held");
  FUZZ_CHECK(Eventually([&] { return d.sessions.List().empty(); }),
             d.sessions.List().size(), " sessions still open");
  FUZZ_CHECK(Eventually([&] { return OpenDescriptors() <= baseline; }),
             OpenDescriptors(), " descriptors open, ", baseline,
             " before:", DescribeDescriptors());
}

}  // namespace
}  // namespace hostkv::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hostkv::fuzz::RunOne(data, size);
  return 0;
}
