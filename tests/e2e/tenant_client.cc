// One tenant's side of the multi-user tests: run as another uid by
// tenants_test (fork, setuid, exec), does one thing against the daemon and
// exits with the absl status code it got (0 = OK), printing details.
//   tenant_client TARGET create-pool POOL | attach-pool POOL | delete-pool POOL
//   tenant_client TARGET alloc POOL TOKENS
//   tenant_client TARGET make-shm NAME BYTES        (a 0600 segment, kept)
//   tenant_client TARGET register-shm POOL NAME     (names from this uid)
//   tenant_client TARGET write-free POOL PAGES      (pattern, then free)
//   tenant_client TARGET alloc-zeros POOL PAGES     (exit 0 if all zero)
//   tenant_client TARGET open-sessions N HOLD_MS    ("opened K code C", holds)
//   tenant_client TARGET idle-connections N HOLD_MS ("connected ...", holds,
//                                                    then what came back)
//   tenant_client TARGET handed-fd                  (kOpen over fd 3)
//   tenant_client TARGET pass-lingering HOLD_MS     (TCP sockets lingering on
//                                                    unsent data passed with
//                                                    kOpen and kPassFd, held)
//   tenant_client TARGET truncate-segment POOL      (exit 0 if refused)
//   tenant_client TARGET publish|lookup ...         (tenant_cache_commands.h)
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hostkv/client.h"
#include "proto/contract/session_socket.h"
#include "tests/e2e/tenant_cache_commands.h"

namespace hostkv {
namespace {

v1::PoolSpec SmallSpec(const std::string& name) {
  v1::PoolSpec spec;
  spec.set_name(name);
  spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  auto* mha = spec.mutable_geometry()->mutable_mha();
  mha->set_num_layers(2);
  mha->set_num_kv_heads(1);
  mha->set_head_dim(8);
  spec.set_page_size(4);
  spec.set_layout(v1::LAYOUT_PAGE_FIRST);
  spec.set_capacity_tokens(60);
  return spec;
}

int Report(const absl::Status& status) {
  std::printf("%s\n", status.ToString().c_str());
  return static_cast<int>(status.code());
}

template <typename T>
int Report(const absl::StatusOr<T>& result) {
  return Report(result.status());
}

int PoolCommand(Client& client, const std::string& command,
                const std::string& pool) {
  if (command == "create-pool")
    return Report(client.CreatePool(SmallSpec(pool), false));
  if (command == "attach-pool")
    return Report(client.CreatePool(SmallSpec(pool), true));
  return Report(client.DeletePool(pool));
}

int RegisterShm(Client& client, const std::string& pool,
                const std::string& name) {
  absl::StatusOr<v1::Pool> info = client.GetPool(pool);
  if (!info.ok()) return Report(info);
  const uint64_t slots = info->spec().page_size();
  std::vector<v1::DeviceBuffer> k, v;
  for (uint32_t l = 0; l < info->spec().geometry().mha().num_layers(); ++l) {
    for (auto* side : {&k, &v}) {
      v1::DeviceBuffer b;
      b.set_shm_name(name);
      b.set_size(slots * info->token_stride());
      side->push_back(b);
    }
  }
  return Report(client.RegisterDeviceBuffers(pool, slots, k, v));
}

int WriteFree(Client& client, const std::string& pool, uint64_t pages) {
  absl::StatusOr<v1::Pool> info = client.GetPool(pool);
  if (!info.ok()) return Report(info);
  auto runs = client.Alloc(pool, pages * info->spec().page_size());
  if (!runs.ok()) return Report(runs);
  const std::string data(pages * info->page_bytes(), '\xa5');
  if (absl::Status s = client.WritePages(pool, *runs, data); !s.ok())
    return Report(s);
  return Report(client.Free(pool, *runs));
}

int AllocZeros(Client& client, const std::string& pool, uint64_t pages) {
  absl::StatusOr<v1::Pool> info = client.GetPool(pool);
  if (!info.ok()) return Report(info);
  auto runs = client.Alloc(pool, pages * info->spec().page_size());
  if (!runs.ok()) return Report(runs);
  auto data = client.ReadPages(pool, *runs);
  if (!data.ok()) return Report(data);
  uint64_t nonzero = 0;
  for (char c : *data) nonzero += c != 0;
  std::printf("read %zu bytes, %llu not zero\n", data->size(),
              static_cast<unsigned long long>(nonzero));
  return nonzero == 0 ? 0 : 100;
}

int OpenSessions(const std::string& target, int n, int hold_ms) {
  std::vector<std::unique_ptr<Client>> held;
  absl::Status last;
  for (int i = 0; i < n; ++i) {
    auto client = Client::Connect(target, absl::StrCat("flood-", i));
    if (!client.ok()) {
      last = client.status();
      break;
    }
    held.push_back(std::move(*client));
  }
  std::printf("opened %zu code %d %s\n", held.size(),
              static_cast<int>(last.code()),
              std::string(last.message()).c_str());
  std::fflush(stdout);
  usleep(static_cast<useconds_t>(hold_ms) * 1000);
  return 0;
}

int IdleConnections(const std::string& target, int n, int hold_ms) {
  const std::string path = target.substr(5) + kSessionSocketSuffix;
  std::vector<int> fds;
  int failed = 0;
  for (int i = 0; i < n; ++i) {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    if (fd < 0 ||
        connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ++failed;
      if (fd >= 0) close(fd);
      continue;
    }
    fds.push_back(fd);
  }
  std::printf("connected %zu failed %d\n", fds.size(), failed);
  std::fflush(stdout);
  usleep(static_cast<useconds_t>(hold_ms) * 1000);
  // What the daemon said to each: nothing yet (still open), or a refusal
  // (too many) or a timeout (no attach in time), then the close.
  int open = 0, exhausted = 0, timed_out = 0;
  for (int fd : fds) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) == 0) {
      ++open;
      continue;
    }
    SessionReply reply{};
    const ssize_t got = recv(fd, &reply, sizeof(reply), MSG_DONTWAIT);
    if (got == sizeof(reply) &&
        reply.code ==
            static_cast<uint32_t>(absl::StatusCode::kResourceExhausted)) {
      ++exhausted;
    } else if (got == sizeof(reply) &&
               reply.code ==
                   static_cast<uint32_t>(absl::StatusCode::kDeadlineExceeded)) {
      ++timed_out;
    }
  }
  std::printf("open %d exhausted %d timed_out %d\n", open, exhausted,
              timed_out);
  for (int fd : fds) close(fd);
  return 0;
}

// Fetches pool `pool`'s segment and prints "writable=0|1"; exit 14 if a
// read-write mapping's success disagrees with that flag.
int FetchSegment(Client& client, const std::string& pool) {
  auto segment = client.FetchPoolSegment(pool);
  if (!segment.ok()) return Report(segment);
  ScopedFd fd(segment->fd);
  struct stat st {};
  fstat(fd.get(), &st);
  void* rw = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                  fd.get(), 0);
  const bool mapped_rw = rw != MAP_FAILED;
  if (mapped_rw) munmap(rw, st.st_size);
  std::printf("writable=%d\n", segment->writable ? 1 : 0);
  return mapped_rw == segment->writable ? 0 : 14;
}

// Fetches pool `pool`'s segment and tries to cut it short (ftruncate to 0
// and to half): exit 0 if both were refused, 16 if one was done.
int TruncateSegment(Client& client, const std::string& pool) {
  auto segment = client.FetchPoolSegment(pool);
  if (!segment.ok()) return Report(segment);
  ScopedFd fd(segment->fd);
  struct stat st {};
  fstat(fd.get(), &st);
  const int to_zero = ftruncate(fd.get(), 0) == 0 ? 0 : errno;
  const int to_half = ftruncate(fd.get(), st.st_size / 2) == 0 ? 0 : errno;
  std::printf("writable=%d truncate: %s, %s\n", segment->writable ? 1 : 0,
              to_zero == 0 ? "done" : std::strerror(to_zero),
              to_half == 0 ? "done" : std::strerror(to_half));
  return to_zero != 0 && to_half != 0 ? 0 : 16;
}

int HandedFd() {
  const SessionMessage m = NewSessionMessage(SessionMessageKind::kOpen, "handed");
  SendRecord(3, &m, sizeof(m));
  SessionReply reply{};
  ReceivedRecord got = ReceiveRecord(3, &reply, sizeof(reply), false);
  if (got.bytes != sizeof(reply))
    return Report(absl::UnavailableError("no reply"));
  reply.message[sizeof(reply.message) - 1] = '\0';
  return Report(
      absl::Status(static_cast<absl::StatusCode>(reply.code), reply.message));
}

// A loopback TCP connection whose client end lingers 600 s on close with
// its send buffer full of data the accepted end never reads.
struct LingeringPair {
  int listener = -1, accepted = -1, client = -1;
};

LingeringPair MakeLingeringPair() {
  LingeringPair p;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  p.listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  p.client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (bind(p.listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(p.listener, 1) != 0 ||
      getsockname(p.listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      connect(p.client, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    std::exit(15);
  }
  p.accepted = accept4(p.listener, nullptr, nullptr, SOCK_CLOEXEC);
  const linger lingering{1, 600};
  setsockopt(p.client, SOL_SOCKET, SO_LINGER, &lingering, sizeof(lingering));
  fcntl(p.client, F_SETFL, fcntl(p.client, F_GETFL) | O_NONBLOCK);
  static char chunk[65536];
  size_t sent = 0;
  for (ssize_t n; (n = send(p.client, chunk, sizeof(chunk), MSG_NOSIGNAL)) > 0;)
    sent += static_cast<size_t>(n);
  std::printf("filled %zu bytes\n", sent);
  std::fflush(stdout);
  return p;
}

// Prints "LABEL: code C MESSAGE" for the next reply on `socket` (-1: none
// within its SO_RCVTIMEO).
void PrintReply(int socket, const char* label) {
  SessionReply reply{};
  ReceivedRecord got = ReceiveRecord(socket, &reply, sizeof(reply), false);
  reply.message[sizeof(reply.message) - 1] = '\0';
  const bool came = got.bytes == sizeof(reply);
  std::printf("%s: code %d %s\n", label,
              came ? static_cast<int>(reply.code) : -1,
              came ? reply.message : "no reply");
  std::fflush(stdout);
}

// Sends `m` (with `pass` as SCM_RIGHTS if >= 0) and prints "LABEL sent:
// yes" or the error; returns whether it went.
bool SendAndSay(int socket, const SessionMessage& m, int pass,
                const char* label) {
  const bool sent = SendRecord(socket, &m, sizeof(m), pass);
  std::printf("%s sent: %s\n", label, sent ? "yes" : std::strerror(errno));
  std::fflush(stdout);
  return sent;
}

// Issue 25, finding 6: lingering sockets passed with records the daemon
// must refuse, this process's copies closed at once. On one connection,
// once its session is open, sent without waiting in between: kPassFd +
// socket, kOpen + socket. Then on a fresh connection (no session: where
// the kernel has SO_PASSRIGHTS it refuses the descriptor, EPERM): kOpen +
// socket. Holds the other ends.
int PassLingeringSockets(const std::string& target, int hold_ms) {
  const std::string path = target.substr(5) + kSessionSocketSuffix;
  std::vector<LingeringPair> held;
  int connections[2];
  for (int& fd : connections) {
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    const timeval patience{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
      return 14;
  }
  for (int i = 0; i < 3; ++i) held.push_back(MakeLingeringPair());
  const SessionMessage open = NewSessionMessage(SessionMessageKind::kOpen, "lingering");
  const SessionMessage pass = NewSessionMessage(SessionMessageKind::kPassFd, "lingering");
  if (SendAndSay(connections[0], open, -1, "open")) {
    PrintReply(connections[0], "open");
  }
  const bool pass_sent =
      SendAndSay(connections[0], pass, held[0].client, "kPassFd");
  const bool open_sent =
      SendAndSay(connections[0], open, held[1].client, "kOpen");
  // A copy the daemon did not get is kept: closing it here would linger.
  if (pass_sent) close(held[0].client);
  if (open_sent) close(held[1].client);
  if (pass_sent) PrintReply(connections[0], "kPassFd");
  if (open_sent) PrintReply(connections[0], "kOpen");
  const bool fresh_sent =
      SendAndSay(connections[1], open, held[2].client, "fresh kOpen");
  if (fresh_sent) {
    close(held[2].client);
    PrintReply(connections[1], "fresh kOpen");
  }
  std::printf("holding\n");
  std::fflush(stdout);
  usleep(static_cast<useconds_t>(hold_ms) * 1000);
  return 0;
}

int Main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string target = argv[1], command = argv[2];
  auto arg = [&](int i) {
    return i < argc ? std::string(argv[i]) : std::string();
  };
  if (command == "open-sessions") {
    return OpenSessions(target, std::atoi(argv[3]), std::atoi(argv[4]));
  }
  if (command == "idle-connections") {
    return IdleConnections(target, std::atoi(argv[3]), std::atoi(argv[4]));
  }
  if (command == "handed-fd") return HandedFd();
  if (command == "pass-lingering")
    return PassLingeringSockets(target, std::atoi(argv[3]));
  if (command == "make-shm") {
    const int fd = shm_open(arg(3).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, std::atoll(argv[4])) != 0) return 13;
    return 0;
  }
  auto client = Client::Connect(target, "tenant");
  if (!client.ok()) return Report(client);
  Client& c = **client;
  if (command == "create-pool" || command == "attach-pool" ||
      command == "delete-pool") {
    return PoolCommand(c, command, arg(3));
  }
  if (command == "alloc")
    return Report(c.Alloc(arg(3), std::strtoull(argv[4], nullptr, 10)));
  if (command == "register-shm") return RegisterShm(c, arg(3), arg(4));
  if (command == "write-free")
    return WriteFree(c, arg(3), std::strtoull(argv[4], nullptr, 10));
  if (command == "fetch-segment") return FetchSegment(c, arg(3));
  if (command == "truncate-segment") return TruncateSegment(c, arg(3));
  if (command == "alloc-zeros")
    return AllocZeros(c, arg(3), std::strtoull(argv[4], nullptr, 10));
  if (command == "publish") {
    return PublishPages(c, arg(3), arg(4), std::strtoull(argv[5], nullptr, 10),
                        static_cast<uint8_t>(std::atoi(argv[6])));
  }
  if (command == "lookup")
    return LookupPages(c, arg(3), arg(4), std::strtoull(argv[5], nullptr, 10));
  return 2;
}

}  // namespace
}  // namespace hostkv

int main(int argc, char** argv) { return hostkv::Main(argc, argv); }
