// hostkvd: the node-local host KV cache daemon.
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/server.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_builder.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "prometheus/registry.h"
#include "proto/contract/session_socket.h"
#include "proto/contract/status_macros.h"
#include "server/operations/byte_size.h"
#include "server/operations/claim_sweeper.h"
#include "server/operations/daemon_metrics.h"
#include "server/operations/metrics_endpoint.h"
#include "server/operations/daemon_options.h"
#include "server/operations/descriptor_shares.h"
#include "server/operations/flag_sources.h"
#include "server/transfer/gpu_backend.h"
#include "server/service/auth_token.h"
#include "server/service/grpc_listener.h"
#include "server/service/grpc_service.h"
#include "server/service/health_service.h"
#include "server/operations/tier_report.h"
#include "server/tier/cache_tier.h"
#include "server/operations/instance_lock.h"
#include "server/operations/logging.h"
#include "server/pool/memory_budget.h"
#include "server/pool/pool_access.h"
#include "server/pool/pool_registry.h"
#include "server/pool/pool_spec.h"
#include "server/service/reflection_service.h"
#include "server/service/request_handler.h"
#include "server/sessions/session_monitor.h"
#include "server/sessions/session_registry.h"
#include "server/operations/state_collector.h"
#include "server/state/keeper_protocol.h"
#include "server/state/state_adoption.h"
#include "server/state/state_keeper.h"
#include "server/transfer/transfer_engine.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

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
    if (absl::StatusOr<std::shared_ptr<HostPool>> adopted =
            pools.Get(config.pools(i).name());
        adopted.ok()) {
      if (google::protobuf::util::MessageDifferencer::Equals(
              (*adopted)->info().spec(), NormalizePoolSpec(config.pools(i)))) {
        continue;  // adopted from the previous daemon, as configured
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "--config ", path, ": pools[", i, "] ('", config.pools(i).name(),
          "') differs from the pool of that name the previous hostkvd left: "
          "start with --discard_state to drop the old state, or give the "
          "pool another name"));
    }
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
  // Restarts: the state keeper and this daemon's ledger outlive the pools
  // and sessions that write to them.
  std::unique_ptr<StateKeeper> keeper;
  std::unique_ptr<DaemonLedger> ledger;
  v1::RestartStats restart;
  std::unique_ptr<PoolRegistry> pools;
  std::unique_ptr<SessionRegistry> sessions;
  std::unique_ptr<TransferEngine> transfers;
  std::unique_ptr<CacheTier> tier;  // null without --tier
  std::unique_ptr<DigestWorker> digests;  // null with --page_digests=false
  std::unique_ptr<RequestHandler> handler;
  std::unique_ptr<GrpcService> service;
  std::unique_ptr<HealthService> health;
  std::unique_ptr<ReflectionService> reflection;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<GrpcListener> listener;  // hands connections to `server`
  std::unique_ptr<SessionMonitor> monitor;
  std::unique_ptr<ClaimSweeper> claim_sweeper;  // null: --namespace_release_after=0
  std::shared_ptr<StateCollector> collector;
  std::shared_ptr<TierCollector> tier_collector;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint;
  // The socket files this daemon serves on, as they were once in place:
  // removed at its end only while they still name them.
  std::vector<BoundPath> sockets;
};

// Notes what the daemon's socket paths name now (they are in place).
void NoteSockets(const DaemonOptions& o, Daemon& d) {
  if (o.socket_path.empty()) return;
  d.sockets = {IdentifyPath(o.socket_path),
               IdentifyPath(o.socket_path + kSessionSocketSuffix)};
}

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

// Connects to the state keeper (starting one), drops its state with
// --discard_state, adopts it otherwise (deploy/README.md "Restarts and upgrades").
absl::Status KeepState(const DaemonOptions& o, Daemon& d) {
  if (!o.keep_state || o.socket_path.empty()) {
    spdlog::info("state is not kept across restarts ({})",
                 o.socket_path.empty() ? "no unix: socket" : "--keep_state=false");
    return absl::OkStatus();
  }
  const std::string path = o.socket_path + kStateSocketSuffix;
  absl::StatusOr<std::unique_ptr<StateKeeper>> keeper = StateKeeper::Connect(
      path, /*spawn=*/true, o.state_keep_for, KeeperLoggingArgs());
  if (!keeper.ok() && absl::IsPermissionDenied(keeper.status()) && !o.takeover) {
    // Another user listens on the keeper's path (a socket directory others
    // may write to): serving without kept state beats not serving.
    spdlog::error("{}; hostkvd serves without keeping its state across "
                  "restarts",
                  std::string(keeper.status().message()));
    return absl::OkStatus();
  }
  if (!keeper.ok()) return keeper.status();
  d.keeper = std::move(*keeper);
  if (o.discard_state) {
    ASSIGN_OR_RETURN(auto held, d.keeper->Collect());
    RETURN_IF_ERROR(d.keeper->Discard());
    spdlog::warn("--discard_state: dropped what the previous hostkvd left ({} "
                 "descriptors)", held.size());
    held.clear();
    ASSIGN_OR_RETURN(d.keeper, StateKeeper::Connect(path, /*spawn=*/true,
                                                    o.state_keep_for,
                                                    KeeperLoggingArgs()));
  }
  ASSIGN_OR_RETURN(AdoptedState adopted,
                   AdoptState(*d.keeper, o.sessions.max_sessions, *d.pools,
                              *d.sessions));
  d.ledger = std::move(adopted.ledger);
  if (adopted.adopted && d.metrics != nullptr) {
    d.metrics->RecordAdoption(adopted.counts);
  }
  d.restart.set_state_kept(true);
  d.restart.set_generation(adopted.generation);
  d.restart.set_adopted(adopted.adopted);
  d.restart.set_sessions_adopted(static_cast<uint32_t>(adopted.counts.sessions));
  d.restart.set_pages_adopted(adopted.counts.pages_owned);
  d.restart.set_cached_pages_adopted(adopted.counts.pages_cached);
  d.restart.set_pages_dropped(adopted.counts.pages_dropped);
  d.restart.set_keys_dropped(adopted.counts.keys_dropped);
  d.restart.set_adopt_seconds(absl::ToDoubleSeconds(adopted.duration));
  return absl::OkStatus();
}

absl::Status BuildState(const DaemonOptions& o, Daemon& d) {
  const std::string prefix = SegmentPrefix(o.socket_path);
  if (!o.metrics_listen.empty()) {
    d.registry = std::make_shared<prometheus::Registry>();
    d.metrics = std::make_unique<DaemonMetrics>(d.registry);
  }
  d.budget = std::make_unique<MemoryBudget>(o.budget, o.reserve,
                                            &MemoryBudget::SystemAvailableBytes);
  RETURN_IF_ERROR(StartGpuBackend(o, d));
  PoolFillOptions fill = o.pool_fill;
  ASSIGN_OR_RETURN(fill.numa_node,
                   ChooseNumaNode(o.numa, fill.sysfs_root,
                                  d.gpu != nullptr ? d.gpu->PciBusId() : ""));
  if (fill.numa_node != kNoNode) {
    spdlog::info("pools' memory on NUMA node {}", fill.numa_node);
  }
  d.pools = std::make_unique<PoolRegistry>(
      d.budget.get(), prefix, fill,
      d.gpu.get(), o.quota, o.cache);
  d.sessions = std::make_unique<SessionRegistry>(prefix, o.signal_records,
                                                 o.sessions, d.budget.get());
  d.transfers = std::make_unique<TransferEngine>(o.copy_threads, d.metrics.get(),
                                                 d.gpu.get());
  d.handler = std::make_unique<RequestHandler>(
      o.limits, d.budget.get(), d.pools.get(), d.sessions.get(),
      d.transfers.get(), d.metrics.get(), d.gpu.get());
  if (!o.tier.url.empty()) {
    absl::StatusOr<std::unique_ptr<CacheTier>> tier = CacheTier::Open(o.tier);
    if (!tier.ok()) {
      return absl::Status(tier.status().code(),
                          absl::StrCat("--tier=", o.tier.url, ": ",
                                       tier.status().message()));
    }
    d.tier = *std::move(tier);
    d.handler->set_tier(d.tier.get());
  }
  if (o.digests.enabled) {
    d.digests = std::make_unique<DigestWorker>();
    d.handler->set_digests(d.digests.get(), o.digests.verify_hits);
  }
  return absl::OkStatus();
}

// The previous daemon's state, then the --config pools; then requests are
// let in.
absl::Status AdoptAndConfigure(const DaemonOptions& o, Daemon& d) {
  RETURN_IF_ERROR(KeepState(o, d));
  d.handler->set_restart_stats(d.restart);
  if (d.digests != nullptr) {
    // Adopted pages whose ledger had no digest (taken after a crash, or
    // by a daemon before digests) get one now.
    for (const std::shared_ptr<HostPool>& pool : d.pools->List()) {
      for (const PageCache::Undigested& ns : pool->cache().ListUndigested()) {
        const std::vector<absl::string_view> keys(ns.keys.begin(), ns.keys.end());
        d.digests->Enqueue(pool, ns.name_space, ns.pages, keys);
      }
    }
  }
  const gid_t config_gid =
      o.socket_gid != static_cast<gid_t>(-1) ? o.socket_gid : getegid();
  RETURN_IF_ERROR(CreateConfiguredPools(
      o.config_path,
      DaemonOwner(geteuid(), config_gid, o.config_pool_access), *d.pools));
  d.handler->Open();
  return absl::OkStatus();
}

absl::Status StartMetrics(const DaemonOptions& o, Daemon& d) {
  if (o.metrics_listen.empty()) return absl::OkStatus();
  d.collector = std::make_shared<StateCollector>(d.pools.get(), d.sessions.get(),
                                                 d.budget.get());
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables = {
      d.registry, d.collector};
  if (d.tier != nullptr) {
    d.tier_collector = std::make_shared<TierCollector>(d.tier.get());
    collectables.push_back(d.tier_collector);
  }
  MetricsEndpointOptions options;
  options.listen = o.metrics_listen;
  options.namespace_names = o.metrics_namespace_names;
  options.label_key = o.metrics_label_key;
  options.connections_per_peer = o.metrics_connections_per_peer;
  if (!o.metrics_token.empty()) {
    auto token = std::make_shared<const TokenAuthorizer>(o.metrics_token);
    options.authorize = [token](absl::string_view authorization) {
      return token->Matches(authorization);
    };
  }
  ASSIGN_OR_RETURN(
      d.metrics_endpoint,
      MetricsEndpoint::Start(std::move(options), std::move(collectables)));
  spdlog::info("metrics on http://{}/metrics ({}; namespaces {})",
               o.metrics_listen,
               o.metrics_token.empty() ? "no token asked" : "token asked",
               o.metrics_namespace_names ? "by name" : "hashed");
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
  // The daemon owns its listening socket (GrpcListener: it recovers from
  // running out of descriptors, and bounds each uid's connections).
  ASSIGN_OR_RETURN(d.listener,
                   GrpcListener::Listen(o.listen, o.max_grpc_connections_per_uid,
                                        o.max_grpc_connections));
  grpc::ServerBuilder builder;
  const int max_message = static_cast<int>(
      std::min<uint64_t>(o.limits.max_page_io_bytes + (1 << 20), INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  // Requests in flight are bounded in memory: past the quota gRPC stops
  // reading more until earlier ones are done.
  grpc::ResourceQuota quota("hostkvd");
  quota.Resize(static_cast<size_t>(o.grpc_memory));
  builder.SetResourceQuota(quota);
  builder.RegisterService(d.service.get());
  builder.RegisterService(d.health.get());
  builder.RegisterService(d.reflection.get());
  d.server = builder.BuildAndStart();
  if (d.server == nullptr) {
    return absl::InternalError("gRPC server did not start");
  }
  d.listener->Serve(d.server.get());
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

// The pid of the daemon serving `socket_path` (the peer of a connection to
// its session socket), or an error saying there is none to take over.
absl::StatusOr<pid_t> ServingDaemonPid(const std::string& socket_path) {
  const std::string path = socket_path + kSessionSocketSuffix;
  ScopedFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  ucred peer{};
  socklen_t len = sizeof(peer);
  // A listener that never accepts (another user's) is not waited for.
  if (fd.get() < 0 || ConnectWithin(fd.get(), path, absl::Seconds(5)) != 0 ||
      getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 ||
      peer.pid <= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--takeover: no hostkvd answers on ", path, " (", std::strerror(errno),
        "); start without --takeover"));
  }
  // In a directory others may write to (sticky), anyone may listen on the
  // path: only a process of this uid is a hostkvd this one may signal.
  if (peer.uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--takeover: what listens on ", path, " is pid ", peer.pid,
        " of uid ", peer.uid, ", not a hostkvd of this uid (", geteuid(),
        "): not signalled; remove ", path, " or start without --takeover"));
  }
  // A daemon holds the instance lock; a listener without it is no hostkvd
  // (the lock, taken here, goes at once).
  if (InstanceLock::Acquire(socket_path).ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--takeover: pid ", peer.pid, " listens on ", path, " but no hostkvd "
        "holds ", socket_path, ".lock: not signalled; start without "
        "--takeover"));
  }
  return peer.pid;
}

// A path beside `socket_path` that nobody can have taken before: other
// users may create files in a sticky socket directory, and a name they can
// guess (the pid) would keep this daemon from binding.
std::string UnguessablePath(const std::string& socket_path) {
  uint64_t random = 0;
  if (getrandom(&random, sizeof(random), 0) != sizeof(random)) {
    random = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  }
  return absl::StrCat(socket_path, ".next.", absl::Hex(random, absl::kZeroPad16));
}

// --takeover: listens beside the running daemon, asks it to drain and exit,
// waits for its instance lock, moves its own sockets into place, adopts the
// state. Requests that arrive meanwhile wait (RequestHandler::AwaitOpen).
absl::Status TakeOver(const DaemonOptions& o, Daemon& d,
                      absl::StatusOr<InstanceLock>* lock) {
  ASSIGN_OR_RETURN(const pid_t old, ServingDaemonPid(o.socket_path));
  DaemonOptions next = o;
  // A path of this daemon's own: the listener removes the path it bound
  // when it stops, and this daemon may itself be taken over later, by a
  // daemon that then listens beside it.
  next.socket_path = UnguessablePath(o.socket_path);
  next.listen = "unix:" + next.socket_path;
  d.handler->HoldRequests();
  RETURN_IF_ERROR(StartServer(next, d));
  const absl::Time start = absl::Now();
  spdlog::info("--takeover: listening beside hostkvd pid {}; asking it to "
               "drain and exit", old);
  if (kill(old, SIGTERM) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--takeover: cannot signal hostkvd pid ", old, ": ", std::strerror(errno)));
  }
  bool killed = false;
  while (!(*lock = InstanceLock::Acquire(o.socket_path)).ok()) {
    if (!killed && absl::Now() - start > absl::Seconds(60)) {
      spdlog::warn("--takeover: hostkvd pid {} did not exit within 60 s of "
                   "SIGTERM: killing it", old);
      kill(old, SIGKILL);
      killed = true;
    }
    if (absl::Now() - start > absl::Seconds(75)) return lock->status();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (const char* suffix : {"", kSessionSocketSuffix}) {
    const std::string from = next.socket_path + suffix;
    const std::string to = o.socket_path + suffix;
    if (rename(from.c_str(), to.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("--takeover: rename ", from,
                                              " -> ", to, ": ",
                                              std::strerror(errno)));
    }
  }
  NoteSockets(o, d);
  const absl::Time gone = absl::Now();
  RemoveStaleSegments(SegmentPrefix(o.socket_path));
  RETURN_IF_ERROR(AdoptAndConfigure(o, d));
  spdlog::info("--takeover: took over from pid {}: it drained and exited in "
               "{}, its state adopted in {}", old,
               absl::FormatDuration(gone - start),
               absl::FormatDuration(absl::Now() - gone));
  return absl::OkStatus();
}

// Health: "" and "hostkv.v1.HostKV" for the daemon, "hostkv.pool.<name>"
// for each pool (SERVING once it is ready to use), "hostkv.tier" for the
// storage tier (NOT_SERVING while it does not answer; the daemon itself
// stays SERVING).
void PublishHealth(Daemon& d) {
  HealthService* health = d.health.get();
  d.pools->SetObserver([health](const std::string& pool, bool serving) {
    health->SetServing("hostkv.pool." + pool, serving);
  });
  if (d.tier != nullptr) {
    d.tier->health().SetObserver([health](bool up) {
      health->SetServing("hostkv.tier", up);
    });
  }
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
  d.claim_sweeper.reset();  // claims stay as the next daemon adopts them
  d.monitor.reset();  // no session ends while the daemon drains
  d.handler->BeginShutdown();
  d.transfers->Drain();
  d.listener->Stop();  // no new connections
  d.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  d.server->Wait();
  if (d.tier != nullptr) {
    // Pages published before the signal still reach the tier (a while).
    if (!d.tier->writer().Flush(absl::Seconds(5))) {
      spdlog::warn("tier {}: pages still queued after 5 s are not written",
                   d.tier->Describe());
    }
    d.tier->Stop();
  }
  // After a --takeover the sockets were moved here from beside them; a
  // daemon taking over this one may have bound its own beside them.
  for (const BoundPath& bound : d.sockets) UnlinkIfStillOurs(bound);
}

int Fail(int code, const absl::Status& status) {
  spdlog::error("{}", std::string(status.message()));
  return code;
}

// Session connections, passed memfds and gRPC's own connections all take
// descriptors; gRPC's listener does not recover once accept() hits EMFILE,
// so the soft limit goes up to the hard one.
// Returns the soft limit now.
uint64_t RaiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  if (limit.rlim_cur < limit.rlim_max) {
    const rlim_t before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) == 0) {
      spdlog::debug("file descriptor limit raised from {} to {}", before,
                    limit.rlim_cur);
    }
  }
  getrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur;
}

int Run() {
  absl::StatusOr<DaemonOptions> options = ReadDaemonOptions();
  if (!options.ok()) return Fail(2, options.status());
  DaemonOptions& o = *options;
  // What clients can make the daemon hold is shared out of its descriptor
  // limit, so that all users together cannot take the descriptors it needs.
  const DescriptorShares shares = ShareDescriptorLimit(RaiseFileLimit());
  o.limits.max_passed_fds = shares.passed_fds;
  // One uid takes at most a quarter of those, whatever the flag says (a
  // small descriptor limit would leave the flag's default above the total).
  o.limits.max_passed_fds_per_uid = std::min(
      o.limits.max_passed_fds_per_uid, std::max(1u, o.limits.max_passed_fds / 4));
  // Refused descriptors waiting to be closed, all uids: room for two
  // records at least. One uid holds at most what leaves another room for a
  // record, so that no single uid's share can stall another's reads.
  DescriptorCloserLimits& refused = o.connections.refused_fds;
  refused.max_total = static_cast<size_t>(shares.refused_fds);
  refused.max_per_uid =
      std::min(refused.max_per_uid, refused.max_total - (kMaxRecordFds + 1));
  o.connections.max_connections =
      std::min(o.connections.max_connections, shares.session_connections);
  o.connections.max_command_rings =
      std::min(o.connections.max_command_rings, shares.command_rings);
  o.max_grpc_connections = shares.grpc_connections;
  if (shares.limit < 4096) {
    spdlog::warn("a descriptor limit of {} is low for a daemon many engines "
                 "share (`ulimit -n`); shares {}",
                 shares.limit, shares.ToString());
  } else {
    spdlog::info("descriptor shares {}", shares.ToString());
  }
  if ((o.socket_mode & 0006) != 0 && o.quota.max_pool_bytes_per_uid == 0) {
    spdlog::warn("--socket_mode={:o} lets every local user in, and "
                 "--max_pool_bytes_per_uid is 0: any of them may take all the "
                 "host memory the budget allows",
                 o.socket_mode);
  }
  absl::StatusOr<InstanceLock> lock = absl::UnknownError("");
  Daemon d;
  if (o.takeover) {
    if (absl::Status s = BuildState(o, d); !s.ok()) return Fail(1, s);
    if (absl::Status s = TakeOver(o, d, &lock); !s.ok()) return Fail(1, s);
  } else {
    if (!o.socket_path.empty()) {
      lock = InstanceLock::Acquire(o.socket_path);
      if (!lock.ok()) return Fail(1, lock.status());
    }
    if (int stale = RemoveStaleSegments(SegmentPrefix(o.socket_path)); stale > 0) {
      spdlog::info("removed {} shared-memory segments left by dead daemons", stale);
    }
    if (absl::Status s = BuildState(o, d); !s.ok()) return Fail(1, s);
    if (absl::Status s = AdoptAndConfigure(o, d); !s.ok()) return Fail(1, s);
    if (absl::Status s = StartServer(o, d); !s.ok()) return Fail(1, s);
    NoteSockets(o, d);
  }
  if (absl::Status s = StartMetrics(o, d); !s.ok()) return Fail(1, s);
  if (o.namespace_release_after > absl::ZeroDuration()) {
    d.claim_sweeper = std::make_unique<ClaimSweeper>(
        d.pools.get(), d.sessions.get(), o.namespace_release_after);
  }
  PublishHealth(d);
  spdlog::info("hostkvd {} listening on {} (backend {}, {} copy threads, "
               "budget {}, reserve {})",
               HOSTKV_VERSION, o.listen, d.gpu != nullptr ? "cuda+cpu" : "cpu",
               o.copy_threads,
               o.budget == 0 ? std::string("available memory") : FormatBytes(o.budget),
               FormatBytes(o.reserve));
  WaitAndDrain(o, d);
  d.pools->SetObserver(nullptr);  // the health service goes first
  if (d.tier != nullptr) d.tier->health().SetObserver(nullptr);
  spdlog::info("hostkvd stopped");
  if (d.keeper != nullptr) {
    spdlog::info("its state keeper (pid {}, {}{}) keeps the pools, cached pages "
                 "and sessions for {} more: a hostkvd started on {} by then "
                 "adopts them warm; `kill {}` (or starting hostkvd with "
                 "--discard_state) lets them go now",
                 d.keeper->pid(), o.socket_path, kStateSocketSuffix,
                 absl::FormatDuration(o.state_keep_for), o.socket_path,
                 d.keeper->pid());
  }
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
      hostkv::GatherFlagSources(argc, argv, hostkv::DaemonFlagNames());
  if (!args.ok()) {
    std::fprintf(stderr, "hostkvd: %s\n", std::string(args.status().message()).c_str());
    return 2;
  }
  std::vector<char*> arg_ptrs;
  for (std::string& a : *args) arg_ptrs.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  if (absl::Status s = hostkv::SetUpLoggingFromFlags(); !s.ok()) {
    std::fprintf(stderr, "hostkvd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (const std::string keeper = hostkv::StateKeeperFlag(); !keeper.empty()) {
    return hostkv::RunStateKeeper(keeper, hostkv::StateKeepForFlag());
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return hostkv::Run();
}
