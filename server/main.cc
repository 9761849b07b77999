// hostkvd: the node-local host KV cache daemon.
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "server/byte_size.h"
#include "server/grpc_service.h"
#include "server/instance_lock.h"
#include "server/memory_budget.h"
#include "server/pool_registry.h"
#include "server/request_handler.h"
#include "proto/contract/session_attach.h"
#include "server/session_monitor.h"
#include "server/session_registry.h"
#include "server/transfer_engine.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "unix:/run/hostkv/hostkvd.sock",
          "gRPC address: unix:PATH (default; the socket gets --socket_mode and "
          "--socket_group), tcp:PORT (127.0.0.1:PORT) or HOST:PORT (TCP on "
          "that interface)");
ABSL_FLAG(std::string, socket_mode, "0660",
          "permissions of the Unix sockets (PATH and PATH.session)");
ABSL_FLAG(std::string, socket_group, "",
          "group of the Unix sockets (default: the daemon's)");
ABSL_FLAG(absl::Duration, session_lease, absl::Seconds(30),
          "a session without an attached session socket ends after this long "
          "without a request");
ABSL_FLAG(bool, allow_unverified_shm_names, false,
          "let sessions whose peer is unknown (no session socket, e.g. TCP) "
          "register shared-memory buffers by name; only for trusted "
          "single-user setups");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding a shared token; every call must then carry "
          "'authorization: Bearer <token>' (meant for TCP)");
ABSL_FLAG(std::string, memory_budget, "0",
          "most host memory all pools together may take (e.g. 64GiB); 0 = as "
          "much as is available minus --memory_reserve");
ABSL_FLAG(std::string, memory_reserve, "10GiB",
          "host memory always left to the rest of the node (SGLang keeps 10 "
          "GiB)");
ABSL_FLAG(std::string, config, "",
          "text-format hostkv.v1.DaemonConfig file; its pools are created at "
          "start");
ABSL_FLAG(std::string, log_level, "info",
          "trace, debug, info, warn, error or off");
ABSL_FLAG(int, copy_threads, 0,
          "threads copying pages on the CPU backend (0 = one per core)");
ABSL_FLAG(int, signal_records, 256,
          "completion records per session: the most operations one session "
          "may have in flight");
ABSL_FLAG(std::string, max_page_io, "64MiB",
          "most page bytes one ReadPages/WritePages call may move");

namespace hostkv {
namespace {

absl::StatusOr<uint64_t> ByteFlag(const char* name, const std::string& value) {
  absl::StatusOr<uint64_t> bytes = ParseByteSize(value);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": ", bytes.status().message()));
  }
  return bytes;
}

absl::Status CreateConfiguredPools(const std::string& path,
                                   PoolRegistry& pools) {
  if (path.empty()) return absl::OkStatus();
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot read --config ", path));
  std::stringstream text;
  text << file.rdbuf();
  v1::DaemonConfig config;
  if (!google::protobuf::TextFormat::ParseFromString(text.str(), &config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--config ", path, " is not a text-format hostkv.v1.DaemonConfig "
        "(the parser's message is above)"));
  }
  for (int i = 0; i < config.pools_size(); ++i) {
    absl::StatusOr<std::shared_ptr<HostPool>> pool =
        pools.Create(config.pools(i), /*attach_if_exists=*/false);
    if (!pool.ok()) {
      return absl::Status(pool.status().code(),
                          absl::StrCat("--config ", path, ": pools[", i, "] ('",
                                       config.pools(i).name(),
                                       "'): ", pool.status().message()));
    }
  }
  return absl::OkStatus();
}

// Members are destroyed bottom-up: the monitor stops ending sessions before
// the server and the state go away.
struct Daemon {
  std::unique_ptr<MemoryBudget> budget;
  std::unique_ptr<PoolRegistry> pools;
  std::unique_ptr<SessionRegistry> sessions;
  std::unique_ptr<TransferEngine> transfers;
  std::unique_ptr<RequestHandler> handler;
  std::unique_ptr<GrpcService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<SessionMonitor> monitor;
};

// "tcp:PORT" means loopback; everything else is used as given.
std::string ResolveListen(const std::string& listen) {
  if (absl::StartsWith(listen, "tcp:")) return "127.0.0.1:" + listen.substr(4);
  return listen;
}

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  if (path.empty()) return std::string();
  std::ifstream file(path);
  std::string token;
  if (!file || !std::getline(file, token) || token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_token_file ", path, ": cannot read a token"));
  }
  return token;
}

absl::StatusOr<gid_t> ResolveGroup(const std::string& name) {
  if (name.empty()) return static_cast<gid_t>(-1);
  const group* g = getgrnam(name.c_str());
  if (g == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--socket_group: no group named '", name, "'"));
  }
  return g->gr_gid;
}

int Run() {
  const std::string listen = ResolveListen(absl::GetFlag(FLAGS_listen));
  const bool unix_socket = absl::StartsWith(listen, "unix:");
  const std::string socket_path = unix_socket ? listen.substr(5) : "";
  absl::StatusOr<uint64_t> budget =
      ByteFlag("memory_budget", absl::GetFlag(FLAGS_memory_budget));
  absl::StatusOr<uint64_t> reserve =
      ByteFlag("memory_reserve", absl::GetFlag(FLAGS_memory_reserve));
  absl::StatusOr<uint64_t> max_page_io =
      ByteFlag("max_page_io", absl::GetFlag(FLAGS_max_page_io));
  absl::StatusOr<std::string> token = ReadToken(absl::GetFlag(FLAGS_auth_token_file));
  absl::StatusOr<gid_t> socket_gid = ResolveGroup(absl::GetFlag(FLAGS_socket_group));
  uint32_t socket_mode = 0;
  for (const absl::Status& s : {budget.status(), reserve.status(), max_page_io.status(),
                                token.status(), socket_gid.status()}) {
    if (!s.ok()) {
      spdlog::error("{}", std::string(s.message()));
      return 2;
    }
  }
  if (!absl::numbers_internal::safe_strtou32_base(
          absl::GetFlag(FLAGS_socket_mode), &socket_mode, 8) ||
      socket_mode > 0777) {
    spdlog::error("--socket_mode: '{}' is not an octal mode such as 0660",
                  absl::GetFlag(FLAGS_socket_mode));
    return 2;
  }
  const int signal_records = absl::GetFlag(FLAGS_signal_records);
  if (signal_records < 1 || signal_records > 65536) {
    spdlog::error("--signal_records must be in [1, 65536]");
    return 2;
  }
  absl::StatusOr<InstanceLock> lock = absl::UnknownError("");
  if (unix_socket) {
    lock = InstanceLock::Acquire(socket_path);
    if (!lock.ok()) {
      spdlog::error("{}", std::string(lock.status().message()));
      return 1;
    }
  }
  if (int stale = RemoveStaleSegments(); stale > 0) {
    spdlog::info("removed {} shared-memory segments left by dead daemons", stale);
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int copy_threads = absl::GetFlag(FLAGS_copy_threads);
  const std::string prefix = absl::StrCat("/hostkv.", getpid(), ".");

  Daemon d;
  d.budget = std::make_unique<MemoryBudget>(*budget, *reserve,
                                            &MemoryBudget::SystemAvailableBytes);
  d.pools = std::make_unique<PoolRegistry>(d.budget.get(), prefix, cores);
  d.sessions = std::make_unique<SessionRegistry>(prefix, signal_records);
  d.transfers = std::make_unique<TransferEngine>(
      copy_threads > 0 ? static_cast<unsigned>(copy_threads) : cores);
  RequestLimits limits;
  limits.max_page_io_bytes = *max_page_io;
  limits.reserved_segment_prefix = "/hostkv.";
  limits.allow_unverified_shm_names = absl::GetFlag(FLAGS_allow_unverified_shm_names);
  limits.session_lease = absl::GetFlag(FLAGS_session_lease);
  if (limits.session_lease < absl::Seconds(1)) {
    spdlog::error("--session_lease must be at least 1s");
    return 2;
  }
  d.handler = std::make_unique<RequestHandler>(limits, d.budget.get(),
                                               d.pools.get(), d.sessions.get(),
                                               d.transfers.get());
  if (absl::Status s = CreateConfiguredPools(absl::GetFlag(FLAGS_config), *d.pools);
      !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 1;
  }

  d.service = std::make_unique<GrpcService>(d.handler.get(), *token);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials());
  const int max_message = static_cast<int>(
      std::min<uint64_t>(*max_page_io + (1 << 20), INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  builder.RegisterService(d.service.get());
  d.server = builder.BuildAndStart();
  if (d.server == nullptr) {
    spdlog::error("cannot listen on {} (address in use or not permitted?)", listen);
    return 1;
  }
  if (unix_socket) {
    if (chmod(socket_path.c_str(), socket_mode) != 0) {
      spdlog::warn("cannot chmod {} to {:o}", socket_path, socket_mode);
    }
    if (*socket_gid != static_cast<gid_t>(-1) &&
        chown(socket_path.c_str(), -1, *socket_gid) != 0) {
      spdlog::warn("cannot give {} to group {}", socket_path,
                   absl::GetFlag(FLAGS_socket_group));
    }
  } else if (token->empty()) {
    spdlog::warn("listening on TCP {} without --auth_token_file: anyone who "
                 "can reach it can use it", listen);
  }
  absl::StatusOr<std::unique_ptr<SessionMonitor>> monitor = SessionMonitor::Start(
      d.handler.get(), unix_socket ? socket_path + kSessionSocketSuffix : "",
      socket_mode, *socket_gid, limits.session_lease);
  if (!monitor.ok()) {
    spdlog::error("{}", std::string(monitor.status().message()));
    return 1;
  }
  d.monitor = std::move(*monitor);
  grpc::HealthCheckServiceInterface* health = d.server->GetHealthCheckService();
  health->SetServingStatus("hostkv.v1.HostKV", true);
  health->SetServingStatus(true);
  spdlog::info("hostkvd {} listening on {} (backend cpu, {} copy threads, "
               "budget {}, reserve {})",
               HOSTKV_VERSION, listen, copy_threads > 0 ? copy_threads : cores,
               *budget == 0 ? std::string("available memory") : FormatBytes(*budget),
               FormatBytes(*reserve));

  // SIGINT/SIGTERM were blocked before any thread started; wait here.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: draining copies and shutting down (again to exit now)",
               sig);
  std::thread second_signal([signals] {
    int again = 0;
    sigwait(&signals, &again);
    spdlog::warn("second signal {}: exiting now", again);
    std::_Exit(1);
  });
  second_signal.detach();
  health->SetServingStatus(false);
  d.monitor.reset();  // no session ends while the daemon drains
  d.handler->BeginShutdown();
  d.transfers->Drain();
  d.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  d.server->Wait();
  if (unix_socket) unlink(socket_path.c_str());
  spdlog::info("hostkvd stopped");
  return 0;
}

}  // namespace
}  // namespace hostkv

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "hostkvd: node-local host KV cache daemon.\n"
      "  hostkvd [--listen=unix:/run/hostkv/hostkvd.sock] [--config=FILE] ...");
  absl::ParseCommandLine(argc, argv);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  const std::string level = absl::GetFlag(FLAGS_log_level);
  const spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    std::fprintf(stderr, "--log_level: unknown level '%s'\n", level.c_str());
    return 2;
  }
  spdlog::set_level(parsed);
  return hostkv::Run();
}
