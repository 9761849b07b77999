// hostkvd: the node-local host KV cache daemon.
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "proto/contract/session_socket.h"
#include "proto/contract/status_macros.h"
#include "server/byte_size.h"
#include "server/daemon_metrics.h"
#include "server/flag_sources.h"
#include "server/gpu_backend.h"
#include "server/grpc_service.h"
#include "server/health_service.h"
#include "server/instance_lock.h"
#include "server/logging.h"
#include "server/memory_budget.h"
#include "server/pool_access.h"
#include "server/pool_registry.h"
#include "server/reflection_service.h"
#include "server/request_handler.h"
#include "server/session_monitor.h"
#include "server/session_registry.h"
#include "server/state_collector.h"
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
ABSL_FLAG(bool, health_probe_without_token, false,
          "with --auth_token_file, let grpc.health.v1 Check of \"\" (the whole "
          "server) answer without the token, for kubelet/docker probes; every "
          "other service name still needs it");
ABSL_FLAG(int, max_health_watches, 64,
          "most concurrent grpc.health.v1 Watch streams (each holds a server "
          "thread); more get RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, memory_budget, "0",
          "most host memory all pools together may take (e.g. 64GiB); 0 = as "
          "much as is available minus --memory_reserve");
ABSL_FLAG(std::string, memory_reserve, "10GiB",
          "host memory always left to the rest of the node (SGLang keeps 10 "
          "GiB)");
ABSL_FLAG(std::string, config, "",
          "text-format hostkv.v1.DaemonConfig file: pools created at start, "
          "and flags by name (overridden by HOSTKVD_<FLAG> environment "
          "variables, which the command line overrides)");
ABSL_FLAG(std::string, log_level, "info",
          "trace, debug, info, warn, error or off");
ABSL_FLAG(std::string, log_format, "text",
          "text, or json (one object per line) for log collectors");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT serving Prometheus /metrics (e.g. 0.0.0.0:9464); empty = "
          "no metrics endpoint");
ABSL_FLAG(int, copy_threads, 0,
          "threads copying pages on the CPU backend (0 = one per core but "
          "one, which is left to the gRPC threads)");
ABSL_FLAG(int, signal_records, 256,
          "completion records per session: the most operations one session "
          "may have in flight");
ABSL_FLAG(std::string, max_page_io, "64MiB",
          "most page bytes one ReadPages/WritePages call may move");
ABSL_FLAG(std::string, cuda, "auto",
          "CUDA backend: auto (use it when a GPU is found), on (fail without "
          "one), off (CPU backend only)");
ABSL_FLAG(std::string, pin_chunk, "1GiB",
          "pools are registered with CUDA in chunks of about this size");
ABSL_FLAG(int, max_sessions, 4096, "sessions open at once, all users together");
ABSL_FLAG(int, max_sessions_per_uid, 256,
          "sessions one uid may have open (attached over the session socket)");
ABSL_FLAG(int, max_unattached_sessions, 64,
          "sessions without a session socket (TCP or raw gRPC clients, whose "
          "user is unknown) open at once");
ABSL_FLAG(int, max_session_connections, 8192,
          "connections to the session socket, all users together");
ABSL_FLAG(int, max_session_connections_per_uid, 512,
          "connections to the session socket per uid");
ABSL_FLAG(absl::Duration, attach_timeout, absl::Seconds(10),
          "a session-socket connection that opened or attached no session by "
          "then is closed");
ABSL_FLAG(int, max_imports_per_session, 64,
          "device-buffer registrations (and passed descriptors) per session");
ABSL_FLAG(std::string, max_import_bytes_per_session, "1TiB",
          "device bytes one session's registrations may cover (the daemon "
          "maps them)");
ABSL_FLAG(int, max_imports_per_uid, 1024,
          "device-buffer registrations of all sessions of one uid");
ABSL_FLAG(int, max_pools_per_uid, 16,
          "pools one uid may own (--config pools do not count)");
ABSL_FLAG(std::string, max_pool_bytes_per_uid, "0",
          "host memory the pools of one uid may take (0 = only "
          "--memory_budget caps; set it on nodes shared by several users)");
ABSL_FLAG(std::string, pool_access, "owner",
          "who may use a pool a session creates: owner (its uid, and root), "
          "group (also members of its creator's primary group) or any");
ABSL_FLAG(std::string, config_pool_access, "group",
          "who may use the --config pools: owner (the daemon's uid, and root), "
          "group (members of --socket_group, or of the daemon's group) or any");
ABSL_FLAG(std::string, shm_group, "",
          "also accept shared-memory device buffers of other uids that are "
          "group read-write in this group, from session peers in it");
ABSL_FLAG(int, kernel_blocks, 0,
          "thread blocks per copy-kernel launch (0 = the kernel's default, "
          "16: few, as they share the GPU with the engine's kernels)");

namespace hostkv {
namespace {

const std::vector<std::string> kFlagNames = {
    "listen",        "socket_mode",     "socket_group",   "session_lease",
    "allow_unverified_shm_names",       "auth_token_file", "memory_budget",
    "memory_reserve", "log_level",      "log_format",     "metrics_listen",
    "copy_threads",  "signal_records",  "max_page_io",    "cuda",
    "pin_chunk",     "kernel_blocks",   "max_sessions",   "max_sessions_per_uid",
    "max_unattached_sessions",          "max_session_connections",
    "max_session_connections_per_uid",  "attach_timeout",
    "max_imports_per_session",          "max_import_bytes_per_session",
    "max_imports_per_uid",              "max_pools_per_uid",
    "max_pool_bytes_per_uid",           "pool_access",
    "config_pool_access",               "shm_group",
    "health_probe_without_token",       "max_health_watches"};

// Everything the flags say, checked.
struct DaemonOptions {
  std::string listen;       // resolved gRPC address
  std::string socket_path;  // empty for TCP
  uint32_t socket_mode = 0660;
  gid_t socket_gid = static_cast<gid_t>(-1);
  std::string auth_token;
  HealthOptions health;
  uint64_t budget = 0;
  uint64_t reserve = 0;
  unsigned copy_threads = 1;
  RequestLimits limits;
  int signal_records = 256;
  std::string cuda = "auto";
  GpuBackendOptions gpu;
  SessionLimits sessions;
  ConnectionLimits connections;
  PoolQuota quota;
  v1::PoolAccess config_pool_access = v1::POOL_ACCESS_GROUP;
};

absl::StatusOr<uint64_t> ByteFlag(const char* name, const std::string& value) {
  absl::StatusOr<uint64_t> bytes = ParseByteSize(value);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": ", bytes.status().message()));
  }
  return bytes;
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

absl::StatusOr<gid_t> ResolveGroup(const std::string& name,
                                   const char* flag = "socket_group") {
  if (name.empty()) return static_cast<gid_t>(-1);
  uint32_t number = 0;
  if (absl::SimpleAtoi(name, &number)) return static_cast<gid_t>(number);
  const group* g = getgrnam(name.c_str());
  if (g == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": no group named '", name, "'"));
  }
  return g->gr_gid;
}

// A positive int flag as uint32, or InvalidArgument naming it.
absl::StatusOr<uint32_t> CountFlag(const char* name, int value, int min = 1) {
  if (value < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be at least ", min, ", got ", value));
  }
  return static_cast<uint32_t>(value);
}

absl::Status ReadTenantLimits(DaemonOptions& o) {
  ASSIGN_OR_RETURN(o.sessions.max_sessions,
                   CountFlag("max_sessions", absl::GetFlag(FLAGS_max_sessions)));
  ASSIGN_OR_RETURN(o.sessions.max_sessions_per_uid,
                   CountFlag("max_sessions_per_uid",
                             absl::GetFlag(FLAGS_max_sessions_per_uid)));
  ASSIGN_OR_RETURN(o.sessions.max_unattached_sessions,
                   CountFlag("max_unattached_sessions",
                             absl::GetFlag(FLAGS_max_unattached_sessions), 0));
  ASSIGN_OR_RETURN(o.connections.max_connections,
                   CountFlag("max_session_connections",
                             absl::GetFlag(FLAGS_max_session_connections)));
  ASSIGN_OR_RETURN(o.connections.max_connections_per_uid,
                   CountFlag("max_session_connections_per_uid",
                             absl::GetFlag(FLAGS_max_session_connections_per_uid)));
  o.connections.attach_timeout = absl::GetFlag(FLAGS_attach_timeout);
  if (o.connections.attach_timeout < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError("--attach_timeout must be at least 100ms");
  }
  ASSIGN_OR_RETURN(o.limits.max_imports_per_session,
                   CountFlag("max_imports_per_session",
                             absl::GetFlag(FLAGS_max_imports_per_session)));
  ASSIGN_OR_RETURN(o.limits.max_import_bytes_per_session,
                   ByteFlag("max_import_bytes_per_session",
                            absl::GetFlag(FLAGS_max_import_bytes_per_session)));
  ASSIGN_OR_RETURN(o.limits.max_imports_per_uid,
                   CountFlag("max_imports_per_uid",
                             absl::GetFlag(FLAGS_max_imports_per_uid)));
  ASSIGN_OR_RETURN(o.quota.max_pools_per_uid,
                   CountFlag("max_pools_per_uid",
                             absl::GetFlag(FLAGS_max_pools_per_uid), 0));
  ASSIGN_OR_RETURN(o.quota.max_pool_bytes_per_uid,
                   ByteFlag("max_pool_bytes_per_uid",
                            absl::GetFlag(FLAGS_max_pool_bytes_per_uid)));
  absl::StatusOr<v1::PoolAccess> access =
      ParsePoolAccess(absl::GetFlag(FLAGS_pool_access));
  if (!access.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pool_access: ", access.status().message()));
  }
  o.limits.pool_access = *access;
  access = ParsePoolAccess(absl::GetFlag(FLAGS_config_pool_access));
  if (!access.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config_pool_access: ", access.status().message()));
  }
  o.config_pool_access = *access;
  ASSIGN_OR_RETURN(const gid_t shm_group,
                   ResolveGroup(absl::GetFlag(FLAGS_shm_group), "shm_group"));
  if (shm_group != static_cast<gid_t>(-1)) o.limits.shm_group = shm_group;
  return absl::OkStatus();
}

absl::Status ResolveAddress(DaemonOptions& o) {
  const std::string listen = absl::GetFlag(FLAGS_listen);
  // "tcp:PORT" means loopback; everything else is used as given.
  o.listen = absl::StartsWith(listen, "tcp:") ? "127.0.0.1:" + listen.substr(4)
                                              : listen;
  if (absl::StartsWith(o.listen, "unix:")) o.socket_path = o.listen.substr(5);
  if (!absl::numbers_internal::safe_strtou32_base(absl::GetFlag(FLAGS_socket_mode),
                                                  &o.socket_mode, 8) ||
      o.socket_mode > 0777) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--socket_mode: '", absl::GetFlag(FLAGS_socket_mode),
        "' is not an octal mode such as 0660"));
  }
  ASSIGN_OR_RETURN(o.socket_gid, ResolveGroup(absl::GetFlag(FLAGS_socket_group)));
  ASSIGN_OR_RETURN(o.auth_token, ReadToken(absl::GetFlag(FLAGS_auth_token_file)));
  o.health.auth_token = o.auth_token;
  o.health.probe_without_token = absl::GetFlag(FLAGS_health_probe_without_token);
  o.health.max_watches = absl::GetFlag(FLAGS_max_health_watches);
  if (o.health.max_watches < 0 || o.health.max_watches > 65536) {
    return absl::InvalidArgumentError("--max_health_watches must be in [0, 65536]");
  }
  return absl::OkStatus();
}

absl::StatusOr<DaemonOptions> ReadOptions() {
  DaemonOptions o;
  RETURN_IF_ERROR(ResolveAddress(o));
  ASSIGN_OR_RETURN(o.budget, ByteFlag("memory_budget", absl::GetFlag(FLAGS_memory_budget)));
  ASSIGN_OR_RETURN(o.reserve, ByteFlag("memory_reserve", absl::GetFlag(FLAGS_memory_reserve)));
  ASSIGN_OR_RETURN(o.limits.max_page_io_bytes,
                   ByteFlag("max_page_io", absl::GetFlag(FLAGS_max_page_io)));
  o.limits.reserved_segment_prefix = "/hostkv.";
  o.limits.allow_unverified_shm_names = absl::GetFlag(FLAGS_allow_unverified_shm_names);
  o.limits.session_lease = absl::GetFlag(FLAGS_session_lease);
  RETURN_IF_ERROR(ReadTenantLimits(o));
  if (o.limits.session_lease < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--session_lease must be at least 1s");
  }
  o.signal_records = absl::GetFlag(FLAGS_signal_records);
  if (o.signal_records < 1 || o.signal_records > 65536) {
    return absl::InvalidArgumentError("--signal_records must be in [1, 65536]");
  }
  o.cuda = absl::GetFlag(FLAGS_cuda);
  if (o.cuda != "auto" && o.cuda != "on" && o.cuda != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cuda: '", o.cuda, "' is not one of auto, on, off"));
  }
  ASSIGN_OR_RETURN(o.gpu.pin_chunk_bytes,
                   ByteFlag("pin_chunk", absl::GetFlag(FLAGS_pin_chunk)));
  if (o.gpu.pin_chunk_bytes == 0) {
    return absl::InvalidArgumentError("--pin_chunk must be positive");
  }
  const int blocks = absl::GetFlag(FLAGS_kernel_blocks);
  if (blocks < 0 || blocks > 65535) {
    return absl::InvalidArgumentError("--kernel_blocks must be in [0, 65535]");
  }
  o.gpu.kernel_blocks = static_cast<unsigned>(blocks);
  const int threads = absl::GetFlag(FLAGS_copy_threads);
  // Copies saturate memory bandwidth with few threads; a core left free keeps
  // the replies and the layer signals from waiting for a CPU.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  o.copy_threads = threads > 0 ? static_cast<unsigned>(threads)
                               : std::max(1u, cores - 1);
  return o;
}

absl::Status CreateConfiguredPools(const std::string& path,
                                   const v1::PoolOwner& owner,
                                   PoolRegistry& pools) {
  if (path.empty()) return absl::OkStatus();
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  v1::DaemonConfig config;
  if (!google::protobuf::TextFormat::ParseFromString(text.str(), &config)) {
    return absl::InvalidArgumentError(absl::StrCat("--config ", path, " does not parse"));
  }
  for (int i = 0; i < config.pools_size(); ++i) {
    absl::StatusOr<std::shared_ptr<HostPool>> pool =
        pools.Create(config.pools(i), /*attach_if_exists=*/false, owner,
                     Principal{});
    if (!pool.ok()) {
      return absl::Status(pool.status().code(),
                          absl::StrCat("--config ", path, ": pools[", i, "] ('",
                                       config.pools(i).name(),
                                       "'): ", pool.status().message()));
    }
  }
  return absl::OkStatus();
}

// Members are destroyed bottom-up: the monitor stops ending sessions and the
// metrics endpoint stops reading state before the server and the state go.
struct Daemon {
  std::shared_ptr<prometheus::Registry> registry;
  std::unique_ptr<DaemonMetrics> metrics;
  std::unique_ptr<MemoryBudget> budget;
  std::unique_ptr<GpuBackend> gpu;  // outlives the pools and imports
  std::unique_ptr<PoolRegistry> pools;
  std::unique_ptr<SessionRegistry> sessions;
  std::unique_ptr<TransferEngine> transfers;
  std::unique_ptr<RequestHandler> handler;
  std::unique_ptr<GrpcService> service;
  std::unique_ptr<HealthService> health;
  std::unique_ptr<ReflectionService> reflection;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<SessionMonitor> monitor;
  std::shared_ptr<StateCollector> collector;
  std::unique_ptr<prometheus::Exposer> exposer;
};

// The CUDA backend when there is a GPU (and --cuda allows it). Nothing
// calls CUDA before CreateGpuBackend has counted the devices.
absl::Status StartGpuBackend(DaemonOptions o, Daemon& d) {
  if (o.cuda == "off") {
    spdlog::info("CUDA backend off (--cuda=off): CPU backend only");
    return absl::OkStatus();
  }
  // Each import has its own streams; with CUDA's default of 8 hardware
  // queues per device, streams of different engines would share queues, and
  // one backup waiting for its engine's "KV written" could hold up another
  // engine's loads. (Read when CUDA initializes; an operator's value wins.)
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  o.gpu.metrics = d.metrics.get();
  // A failed CUDA context cannot recover in this process: say so where
  // orchestrators look, so that they restart the daemon.
  o.gpu.on_fatal = [&d](const std::string& why) {
    spdlog::critical("GPU backend failed ({}): marking hostkvd NOT_SERVING", why);
    if (d.health != nullptr) d.health->Shutdown();
  };
  absl::StatusOr<std::unique_ptr<GpuBackend>> gpu = CreateGpuBackend(o.gpu);
  if (!gpu.ok()) {
    if (o.cuda == "on") {
      return absl::FailedPreconditionError(
          absl::StrCat("--cuda=on: ", gpu.status().message()));
    }
    spdlog::info("CPU backend only: {}", std::string(gpu.status().message()));
    return absl::OkStatus();
  }
  d.gpu = std::move(*gpu);
  spdlog::info("CUDA backend: {}", d.gpu->Describe());
  return absl::OkStatus();
}

absl::Status BuildState(const DaemonOptions& o, Daemon& d) {
  const std::string prefix = SegmentPrefix(o.socket_path);
  if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
    d.registry = std::make_shared<prometheus::Registry>();
    d.metrics = std::make_unique<DaemonMetrics>(d.registry);
  }
  d.budget = std::make_unique<MemoryBudget>(o.budget, o.reserve,
                                            &MemoryBudget::SystemAvailableBytes);
  RETURN_IF_ERROR(StartGpuBackend(o, d));
  d.pools = std::make_unique<PoolRegistry>(
      d.budget.get(), prefix, std::max(1u, std::thread::hardware_concurrency()),
      d.gpu.get(), o.quota);
  d.sessions = std::make_unique<SessionRegistry>(prefix, o.signal_records,
                                                 o.sessions, d.budget.get());
  d.transfers = std::make_unique<TransferEngine>(o.copy_threads, d.metrics.get(),
                                                 d.gpu.get());
  d.handler = std::make_unique<RequestHandler>(
      o.limits, d.budget.get(), d.pools.get(), d.sessions.get(),
      d.transfers.get(), d.metrics.get(), d.gpu.get());
  const gid_t config_gid =
      o.socket_gid != static_cast<gid_t>(-1) ? o.socket_gid : getegid();
  return CreateConfiguredPools(
      absl::GetFlag(FLAGS_config),
      DaemonOwner(geteuid(), config_gid, o.config_pool_access), *d.pools);
}

absl::Status StartMetrics(Daemon& d) {
  const std::string address = absl::GetFlag(FLAGS_metrics_listen);
  if (address.empty()) return absl::OkStatus();
  try {
    d.exposer = std::make_unique<prometheus::Exposer>(address, 1);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("--metrics_listen ", address, ": ", e.what()));
  }
  d.collector = std::make_shared<StateCollector>(d.pools.get(), d.sessions.get(),
                                                 d.budget.get());
  d.exposer->RegisterCollectable(d.registry);
  d.exposer->RegisterCollectable(d.collector);
  spdlog::info("metrics on http://{}/metrics", address);
  return absl::OkStatus();
}

absl::Status StartServer(const DaemonOptions& o, Daemon& d) {
  d.service = std::make_unique<GrpcService>(d.handler.get(), o.auth_token,
                                            d.metrics.get());
  d.health = std::make_unique<HealthService>(o.health);
  d.reflection = std::make_unique<ReflectionService>(
      o.auth_token, std::vector<std::string>{
                        v1::HostKV::service_full_name(),
                        grpc::health::v1::Health::service_full_name(),
                        grpc::reflection::v1alpha::ServerReflection::service_full_name()});
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen, grpc::InsecureServerCredentials());
  const int max_message = static_cast<int>(
      std::min<uint64_t>(o.limits.max_page_io_bytes + (1 << 20), INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  builder.RegisterService(d.service.get());
  builder.RegisterService(d.health.get());
  builder.RegisterService(d.reflection.get());
  d.server = builder.BuildAndStart();
  if (d.server == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot listen on ", o.listen, " (address in use or not permitted?)"));
  }
  if (!o.socket_path.empty()) {
    RETURN_IF_ERROR(SecureSocketPath(o.socket_path, o.socket_mode, o.socket_gid));
  } else if (o.auth_token.empty()) {
    spdlog::warn("listening on TCP {} without --auth_token_file: anyone who "
                 "can reach it can use it", o.listen);
  }
  ASSIGN_OR_RETURN(d.monitor,
                   SessionMonitor::Start(
                       d.handler.get(),
                       o.socket_path.empty() ? "" : o.socket_path + kSessionSocketSuffix,
                       o.socket_mode, o.socket_gid, o.limits.session_lease,
                       o.connections));
  return absl::OkStatus();
}

// Health: "" and "hostkv.v1.HostKV" for the daemon, "hostkv.pool.<name>"
// for each pool (SERVING once it is ready to use).
void PublishHealth(Daemon& d) {
  HealthService* health = d.health.get();
  d.pools->SetObserver([health](const std::string& pool, bool serving) {
    health->SetServing("hostkv.pool." + pool, serving);
  });
  health->SetServing("hostkv.v1.HostKV", true);
  health->SetServing("", true);
}

// Waits for SIGINT/SIGTERM (blocked in main before any thread started), then
// drains; a second signal exits at once.
void WaitAndDrain(const DaemonOptions& o, Daemon& d) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: draining copies and shutting down (again to exit now)",
               sig);
  std::thread([signals] {
    int again = 0;
    sigwait(&signals, &again);
    spdlog::warn("second signal {}: exiting now", again);
    std::_Exit(1);
  }).detach();
  d.health->Shutdown();  // everything NOT_SERVING
  d.monitor.reset();  // no session ends while the daemon drains
  d.handler->BeginShutdown();
  d.transfers->Drain();
  d.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  d.server->Wait();
  if (!o.socket_path.empty()) unlink(o.socket_path.c_str());
}

int Fail(int code, const absl::Status& status) {
  spdlog::error("{}", std::string(status.message()));
  return code;
}

// Session connections, passed memfds and gRPC's own connections all take
// descriptors; gRPC's listener does not recover once accept() hits EMFILE,
// so the soft limit goes up to the hard one.
void RaiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    const rlim_t before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) == 0) {
      spdlog::debug("file descriptor limit raised from {} to {}", before,
                    limit.rlim_cur);
    }
  }
}

int Run() {
  absl::StatusOr<DaemonOptions> options = ReadOptions();
  if (!options.ok()) return Fail(2, options.status());
  const DaemonOptions& o = *options;
  RaiseFileLimit();
  absl::StatusOr<InstanceLock> lock = absl::UnknownError("");
  if (!o.socket_path.empty()) {
    lock = InstanceLock::Acquire(o.socket_path);
    if (!lock.ok()) return Fail(1, lock.status());
  }
  if (int stale = RemoveStaleSegments(SegmentPrefix(o.socket_path)); stale > 0) {
    spdlog::info("removed {} shared-memory segments left by dead daemons", stale);
  }
  Daemon d;
  if (absl::Status s = BuildState(o, d); !s.ok()) return Fail(1, s);
  if (absl::Status s = StartServer(o, d); !s.ok()) return Fail(1, s);
  if (absl::Status s = StartMetrics(d); !s.ok()) return Fail(1, s);
  PublishHealth(d);
  spdlog::info("hostkvd {} listening on {} (backend {}, {} copy threads, "
               "budget {}, reserve {})",
               HOSTKV_VERSION, o.listen, d.gpu != nullptr ? "cuda+cpu" : "cpu",
               o.copy_threads,
               o.budget == 0 ? std::string("available memory") : FormatBytes(o.budget),
               FormatBytes(o.reserve));
  WaitAndDrain(o, d);
  d.pools->SetObserver(nullptr);  // the health service goes first
  spdlog::info("hostkvd stopped");
  return 0;
}

}  // namespace
}  // namespace hostkv

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "hostkvd: node-local host KV cache daemon.\n"
      "  hostkvd [--listen=unix:/run/hostkv/hostkvd.sock] [--config=FILE] ...\n"
      "Every flag may also come from HOSTKVD_<FLAG> or the config file.");
  absl::StatusOr<std::vector<std::string>> args =
      hostkv::GatherFlagSources(argc, argv, hostkv::kFlagNames);
  if (!args.ok()) {
    std::fprintf(stderr, "hostkvd: %s\n", std::string(args.status().message()).c_str());
    return 2;
  }
  std::vector<char*> arg_ptrs;
  for (std::string& a : *args) arg_ptrs.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  if (absl::Status s = hostkv::SetUpLogging(absl::GetFlag(FLAGS_log_level),
                                            absl::GetFlag(FLAGS_log_format));
      !s.ok()) {
    std::fprintf(stderr, "hostkvd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  return hostkv::Run();
}
