#include "server/operations/daemon_options.h"

#include <grp.h>
#include <sched.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "proto/contract/session_socket.h"
#include "proto/contract/status_macros.h"
#include "server/operations/byte_size.h"
#include "server/operations/flag_sources.h"
#include "server/operations/secret_file.h"
#include "server/operations/logging.h"
#include "server/operations/tier_flags.h"
#include "server/pool/pool_access.h"
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
          "without a request (a duration such as 30s)");
ABSL_FLAG(bool, allow_unverified_shm_names, false,
          "let sessions whose peer is unknown (no session socket, e.g. TCP) "
          "register shared-memory buffers by name; only for trusted "
          "single-user setups");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding a shared token; every call must then carry "
          "'authorization: Bearer <token>' (meant for TCP). Refused if other "
          "users may read or write it (chmod 0600; group access is allowed)");
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
          "no metrics endpoint. It shows counts per pool and per page-cache "
          "namespace (both hashed with a key unless "
          "--metrics_namespace_names)");
ABSL_FLAG(std::string, metrics_token_file, "",
          "file holding a token /metrics then asks for ('Authorization: "
          "Bearer <token>', else 401); refused if other users may read or "
          "write it (chmod 0600; group access is allowed)");
ABSL_FLAG(bool, metrics_namespace_names, false,
          "label the series of /metrics with each namespace's and pool's name "
          "instead of the first 12 hex digits of its HMAC-SHA256 under "
          "--metrics_label_key_file's key (names can tell one user what "
          "another runs: for single-tenant nodes)");
ABSL_FLAG(bool, keep_state, true,
          "keep pools, their pages, sessions and cached keys across a restart "
          "or crash of hostkvd: a state keeper process on <socket>.state holds "
          "them while no daemon runs (unix: sockets only)");
ABSL_FLAG(bool, discard_state, false,
          "at start, drop what a previous hostkvd left (its pools, pages, "
          "sessions and cached keys) instead of adopting it");
ABSL_FLAG(bool, takeover, false,
          "take over from the hostkvd serving the same socket (an upgrade): "
          "listen beside it, ask it to drain and exit (SIGTERM), then adopt "
          "its state and serve; calls meanwhile wait");
ABSL_FLAG(absl::Duration, state_keep_for, absl::Minutes(10),
          "how long the state keeper keeps the state while no hostkvd runs");
ABSL_FLAG(std::string, state_keeper, "",
          "run as the state keeper on this socket path instead of as the "
          "daemon (hostkvd starts one itself; or run it as its own container)");
ABSL_FLAG(int, copy_threads, 0,
          "threads copying pages on the CPU backend (0 = one per CPU this "
          "process may run on but one, at most 8)");
ABSL_FLAG(int, signal_records, 256,
          "completion records per session: the most operations one session "
          "may have in flight");
ABSL_FLAG(std::string, max_page_io, "64MiB",
          "most page bytes one ReadPages/WritePages call may move");
ABSL_FLAG(std::string, grpc_memory, "1GiB",
          "most memory gRPC may hold for requests in flight (its resource "
          "quota: past it, reading more requests waits); at least 4 x "
          "--max_page_io");
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
          "connections to the session socket, all users together (and at "
          "most a quarter of the descriptor limit; the last eighth for users "
          "holding few)");
ABSL_FLAG(int, max_session_connections_per_uid, 512,
          "connections to the session socket per uid");
ABSL_FLAG(int, max_grpc_connections_per_uid, 256,
          "gRPC connections one uid may hold on the unix: socket (one more "
          "is closed at once); 0: no bound. All uids together: a quarter of "
          "the descriptor limit");
ABSL_FLAG(int, max_command_rings, 256,
          "command rings (an engine's hot calls through shared memory; a "
          "uid's rings share ceil(--ring_cpu_per_uid) threads) of all "
          "sessions together, and at most a 16th of the descriptor limit; 0: "
          "none, every call over gRPC");
ABSL_FLAG(absl::Duration, command_ring_spin, absl::Microseconds(250),
          "how long a command ring's thread polls after a call before it "
          "sleeps (a call to a sleeping ring pays a thread wake-up); 0: "
          "never poll");
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
ABSL_FLAG(std::string, cache_share, "owner",
          "who may publish and look up in a page-cache namespace besides the "
          "uid that first published in it (and root): owner (nobody), "
          "group:NAME (members of that group) or any");
ABSL_FLAG(absl::Duration, namespace_release_after, absl::Seconds(60),
          "a cache namespace in which no pool caches a page and whose owner "
          "has no session open is given back (its owner's share and its "
          "ledger slot freed, the name free to claim) within one to two "
          "times this after its last use; 0: never");
ABSL_FLAG(int, max_cache_namespaces_per_uid, 256,
          "page-cache namespaces one uid may claim (in all pools together: a "
          "namespace is its first publisher's in every pool)");
ABSL_FLAG(int, max_cache_refs_per_session, 1 << 22,
          "references one session may hold on cached pages (each keeps a "
          "page from eviction)");
ABSL_FLAG(int, max_cache_refs_per_uid, 1 << 24,
          "references all sessions of one uid may hold on cached pages, in "
          "all pools together (each takes ~24 bytes of the memory budget)");
ABSL_FLAG(absl::Duration, cache_publish_wait, absl::Seconds(30),
          "a Publish of pages that copies in flight still fill waits this "
          "long for them, then fails changing nothing");
ABSL_FLAG(std::string, max_copy_bytes, "1GiB",
          "most bytes one CopyPages call copies (on the request's thread)");
ABSL_FLAG(int, kernel_blocks, 0,
          "thread blocks per copy-kernel launch (0 = the kernel's default, "
          "16: few, as they share the GPU with the engine's kernels)");
ABSL_FLAG(
    absl::Duration, gpu_wait_timeout, absl::Seconds(60),
    "a CUDA transfer still waiting for the engine's mark (wait_kv_written) "
    "after this long is released and reported failed");
ABSL_FLAG(bool, dma_prefer_overlap, true,
          "MECHANISM_DIRECT batches ask the driver to prefer copy engines that "
          "overlap with compute (cudaMemcpyFlagPreferOverlapWithCompute)");

// Command rings and /metrics, per user (server/service/ring_quota.h,
// server/operations/metrics_endpoint.h).
ABSL_FLAG(int, max_command_rings_per_uid, 16,
          "command rings one uid may hold (each a 2 MiB segment charged to "
          "--memory_budget); default 16");
ABSL_FLAG(std::string, ring_cpu_per_uid, "auto",
          "cores the command-ring threads of one uid may use on average "
          "(their calls and their spin); beyond it that uid's rings wait. "
          "The uid's rings are served by ceil(this) threads. auto "
          "(default): a quarter of the CPUs the daemon may use, at least 1; "
          "0: no bound, a thread per ring");
ABSL_FLAG(int, metrics_connections_per_peer, 4,
          "/metrics connections open at once from one peer address; "
          "default 4");
ABSL_FLAG(std::string, metrics_label_key_file, "",
          "file holding the key of /metrics' hashed namespace and pool labels "
          "(HMAC-SHA256); the same key gives the same labels on every node "
          "and across restarts. Default empty: a random key at each start");

// Descriptors clients pass over the session socket (README "Trust model").
ABSL_FLAG(int, max_refused_fds_per_uid, 1024,
          "refused descriptors one uid passed that wait to be closed (on a "
          "thread of that uid's own); past it, less than a record's worth "
          "(253) left, its connections are not read until they are closed "
          "(default 1024, at least 254; all uids together: an eighth of the "
          "descriptor limit, of which one uid leaves a record's worth to "
          "the others)");
ABSL_FLAG(int, max_passed_fds_per_uid, 1024,
          "passed descriptors (kPassFd memfds) the sessions of one uid may "
          "hold together, given back when they go (default 1024, and at most "
          "a quarter of what all uids may: an eighth of the descriptor "
          "limit)");

// Page digests (server/README.md "Page digests").
ABSL_FLAG(bool, page_digests, true,
          "take a CRC32C digest of every published page after its publish "
          "(a background thread) and keep it with its key, in the ledger and "
          "in tier values; hits, restarts and tier reads check pages against "
          "it (default true)");
ABSL_FLAG(double, verify_hits, 0.01,
          "the share of hits (0..1) whose bytes Lookup checks against their "
          "digest before returning them; a page that does not match is a "
          "miss and leaves the cache (default 0.01)");
// Pools' memory: made resident in the background (server/README.md,
// "Pools: sizing and start").
ABSL_FLAG(int, pool_fill_threads, 0,
          "threads making one pool's memory resident (MADV_POPULATE_WRITE) "
          "after CreatePool returns; 0 (default): one per CPU the daemon may "
          "run on (its affinity mask)");
ABSL_FLAG(std::string, pool_fill_chunk, "64MiB",
          "a pool's pages are handed out in chunks of about this many bytes "
          "as each turns resident (default 64MiB, at least 1MiB)");
ABSL_FLAG(absl::Duration, pool_fill_wait, absl::Seconds(60),
          "how long an Alloc waits for a filling pool's pages when it does "
          "not say (AllocRequest.fill_wait_ms 0, fill_no_wait unset); "
          "default 60s");
ABSL_FLAG(std::string, pool_hugepages, "auto",
          "pages of pools that do not say (PoolSpec.hugepages): auto (2M "
          "hugetlb pages if enough are free, else transparent huge pages "
          "where shmem_enabled allows, else 4K), off, 2M, 1G (an error naming "
          "vm.nr_hugepages when too few are free); default auto");
ABSL_FLAG(std::string, numa_node, "auto",
          "NUMA node of pools' memory (mbind) and of their filling threads, "
          "for pools that do not say (PoolSpec.numa_node): auto (the node of "
          "CUDA device 0's PCI device, when the machine has several nodes), "
          "none, or a node number; default auto");

namespace hostkv {
namespace {

const std::vector<std::string> kDigestFlagNames = {"page_digests", "verify_hits"};

absl::Status ReadDigestFlags(DaemonOptions& o) {
  o.digests.enabled = absl::GetFlag(FLAGS_page_digests);
  const double share = absl::GetFlag(FLAGS_verify_hits);
  if (!(share >= 0.0 && share <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--verify_hits must be within 0..1, got ", share));
  }
  o.digests.verify_hits = o.digests.enabled ? share : 0.0;
  return absl::OkStatus();
}

const std::vector<std::string> kPoolFillFlagNames = {
    "pool_fill_threads", "pool_fill_chunk", "pool_fill_wait", "pool_hugepages",
    "numa_node"};

unsigned UsableCpus();

absl::Status ReadPoolFillFlags(DaemonOptions& o) {
  const int threads = absl::GetFlag(FLAGS_pool_fill_threads);
  if (threads < 0 || threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pool_fill_threads must be in [0, 1024] (0 = one per CPU), got ",
        threads));
  }
  o.pool_fill.threads = threads > 0 ? static_cast<unsigned>(threads) : UsableCpus();
  absl::StatusOr<uint64_t> chunk = ParseByteSize(absl::GetFlag(FLAGS_pool_fill_chunk));
  if (!chunk.ok() || *chunk < (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pool_fill_chunk must be a size of at least 1MiB, got '",
        absl::GetFlag(FLAGS_pool_fill_chunk), "'"));
  }
  o.pool_fill.chunk_bytes = *chunk;
  absl::StatusOr<HugePageMode> huge =
      ParseHugePageMode(absl::GetFlag(FLAGS_pool_hugepages));
  if (!huge.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pool_hugepages: ", huge.status().message()));
  }
  o.pool_fill.hugepages = *huge;
  absl::StatusOr<NumaRequest> numa = ParseNumaRequest(absl::GetFlag(FLAGS_numa_node));
  if (!numa.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--numa_node: ", numa.status().message()));
  }
  o.numa = *numa;
  o.limits.fill_wait = absl::GetFlag(FLAGS_pool_fill_wait);
  if (o.limits.fill_wait < absl::ZeroDuration() ||
      o.limits.fill_wait > absl::Minutes(10)) {
    return absl::InvalidArgumentError(
        "--pool_fill_wait must be in [0, 10m]");
  }
  return absl::OkStatus();
}

const std::vector<std::string> kDescriptorFlagNames = {
    "max_refused_fds_per_uid", "max_passed_fds_per_uid"};

absl::Status ReadDescriptorLimits(DaemonOptions& o) {
  const int refused = absl::GetFlag(FLAGS_max_refused_fds_per_uid);
  if (refused < static_cast<int>(kMaxRecordFds) + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_refused_fds_per_uid must be at least ", kMaxRecordFds + 1,
        " (what one record can carry, and one), got ", refused));
  }
  o.connections.refused_fds.max_per_uid = static_cast<size_t>(refused);
  const int passed = absl::GetFlag(FLAGS_max_passed_fds_per_uid);
  if (passed < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_passed_fds_per_uid must be at least 1, got ", passed));
  }
  o.limits.max_passed_fds_per_uid = static_cast<uint32_t>(passed);
  return absl::OkStatus();
}

}  // namespace
}  // namespace hostkv

namespace hostkv {
namespace {

// The CPUs this process may run on: its affinity mask (a container's
// cpuset), else every online CPU. A CPU quota (cgroup cpu.max) is not read:
// set --copy_threads to the CPU request there.
unsigned UsableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<unsigned>(n);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}


const std::vector<std::string> kFlagNames = {"listen",
                                             "socket_mode",
                                             "socket_group",
                                             "session_lease",
                                             "allow_unverified_shm_names",
                                             "auth_token_file",
                                             "memory_budget",
                                             "memory_reserve",
                                             "log_level",
                                             "log_format",
                                             "metrics_listen",
                                             "metrics_token_file",
                                             "metrics_namespace_names",
                                             "keep_state",
                                             "takeover",
                                             "discard_state",
                                             "state_keep_for",
                                             "copy_threads",
                                             "signal_records",
                                             "max_page_io",
                                             "grpc_memory",
                                             "cuda",
                                             "pin_chunk",
                                             "kernel_blocks",
                                             "max_sessions",
                                             "max_sessions_per_uid",
                                             "max_unattached_sessions",
                                             "max_session_connections",
                                             "max_session_connections_per_uid",
                                             "max_grpc_connections_per_uid",
                                             "attach_timeout",
                                             "max_command_rings",
                                             "command_ring_spin",
                                             "max_imports_per_session",
                                             "max_import_bytes_per_session",
                                             "max_imports_per_uid",
                                             "max_pools_per_uid",
                                             "max_pool_bytes_per_uid",
                                             "pool_access",
                                             "config_pool_access",
                                             "shm_group",
                                             "cache_share",
                                             "max_cache_namespaces_per_uid",
                                             "namespace_release_after",
                                             "max_cache_refs_per_session",
                                             "max_cache_refs_per_uid",
                                             "cache_publish_wait",
                                             "max_copy_bytes",
                                             "health_probe_without_token",
                                             "max_health_watches",
                                             "gpu_wait_timeout",
                                             "dma_prefer_overlap",
                                             "max_command_rings_per_uid",
                                             "ring_cpu_per_uid",
                                             "metrics_connections_per_peer",
                                             "metrics_label_key_file"};

absl::StatusOr<uint64_t> ByteFlag(const char* name, const std::string& value) {
  absl::StatusOr<uint64_t> bytes = ParseByteSize(value);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": ", bytes.status().message()));
  }
  return bytes;
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

// A pool access flag as the enum, or InvalidArgument naming it.
absl::StatusOr<v1::PoolAccess> AccessFlag(const char* name,
                                          const std::string& value) {
  absl::StatusOr<v1::PoolAccess> access = ParsePoolAccess(value);
  if (!access.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": ", access.status().message()));
  }
  return access;
}

// The per-user bounds of command rings and /metrics connections.
absl::Status ReadRingAndMetricsBounds(DaemonOptions& o) {
  ASSIGN_OR_RETURN(o.connections.max_command_rings_per_uid,
                   CountFlag("max_command_rings_per_uid",
                             absl::GetFlag(FLAGS_max_command_rings_per_uid)));
  const std::string cpu_text = absl::GetFlag(FLAGS_ring_cpu_per_uid);
  double cpu = std::max(1u, UsableCpus() / 4);
  if (cpu_text != "auto" && (!absl::SimpleAtod(cpu_text, &cpu) ||
                             !(cpu >= 0) || cpu > 1024)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ring_cpu_per_uid must be auto or cores in [0, 1024], "
                     "got '", cpu_text, "'"));
  }
  if (cpu > 0 && cpu < 0.01) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ring_cpu_per_uid below 0.01 cores starves the rings, got ", cpu));
  }
  o.connections.ring_cpu_per_uid = cpu;
  ASSIGN_OR_RETURN(o.metrics_connections_per_peer,
                   CountFlag("metrics_connections_per_peer",
                             absl::GetFlag(FLAGS_metrics_connections_per_peer)));
  const std::string key_file = absl::GetFlag(FLAGS_metrics_label_key_file);
  if (!key_file.empty()) {
    ASSIGN_OR_RETURN(o.metrics_label_key,
                     ReadSecretFile("metrics_label_key_file", key_file, "a key"));
  } else {
    o.metrics_label_key.resize(32);
    if (getrandom(o.metrics_label_key.data(), o.metrics_label_key.size(), 0) !=
        static_cast<ssize_t>(o.metrics_label_key.size())) {
      return absl::InternalError("no random bytes for the /metrics label key");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadCacheOptions(DaemonOptions& o) {
  std::string share = absl::GetFlag(FLAGS_cache_share);
  if (share == "group:") {
    return absl::InvalidArgumentError("--cache_share=group: needs a group name");
  }
  if (absl::StartsWith(share, "group:")) {
    ASSIGN_OR_RETURN(const gid_t gid, ResolveGroup(share.substr(6), "cache_share"));
    share = absl::StrCat("group:", gid);
  }
  absl::StatusOr<CacheSharing> sharing = ParseCacheSharing(share);
  if (!sharing.ok()) return sharing.status();
  o.cache.sharing = *sharing;
  ASSIGN_OR_RETURN(o.cache.max_namespaces_per_uid,
                   CountFlag("max_cache_namespaces_per_uid",
                             absl::GetFlag(FLAGS_max_cache_namespaces_per_uid)));
  ASSIGN_OR_RETURN(const uint32_t refs,
                   CountFlag("max_cache_refs_per_session",
                             absl::GetFlag(FLAGS_max_cache_refs_per_session)));
  o.limits.max_cache_refs_per_session = refs;
  ASSIGN_OR_RETURN(const uint32_t uid_refs,
                   CountFlag("max_cache_refs_per_uid",
                             absl::GetFlag(FLAGS_max_cache_refs_per_uid)));
  o.limits.max_cache_refs_per_uid = uid_refs;
  o.limits.cache_publish_wait = absl::GetFlag(FLAGS_cache_publish_wait);
  if (o.limits.cache_publish_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--cache_publish_wait must not be negative");
  }
  ASSIGN_OR_RETURN(o.limits.max_copy_bytes,
                   ByteFlag("max_copy_bytes", absl::GetFlag(FLAGS_max_copy_bytes)));
  return absl::OkStatus();
}

absl::Status ReadTenantLimits(DaemonOptions& o) {
  ASSIGN_OR_RETURN(
      o.sessions.max_sessions,
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
  ASSIGN_OR_RETURN(
      o.connections.max_connections_per_uid,
      CountFlag("max_session_connections_per_uid",
                absl::GetFlag(FLAGS_max_session_connections_per_uid)));
  ASSIGN_OR_RETURN(
      o.max_grpc_connections_per_uid,
      CountFlag("max_grpc_connections_per_uid",
                absl::GetFlag(FLAGS_max_grpc_connections_per_uid), 0));
  o.namespace_release_after = absl::GetFlag(FLAGS_namespace_release_after);
  if (o.namespace_release_after < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--namespace_release_after must not be negative");
  }
  ASSIGN_OR_RETURN(o.connections.max_command_rings,
                   CountFlag("max_command_rings",
                             absl::GetFlag(FLAGS_max_command_rings), 0));
  o.connections.command_ring_spin = absl::GetFlag(FLAGS_command_ring_spin);
  if (o.connections.command_ring_spin < absl::ZeroDuration() ||
      o.connections.command_ring_spin > absl::Milliseconds(10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--command_ring_spin must be in [0, 10ms], got ",
        absl::FormatDuration(o.connections.command_ring_spin)));
  }
  o.connections.attach_timeout = absl::GetFlag(FLAGS_attach_timeout);
  if (o.connections.attach_timeout < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError(
        "--attach_timeout must be at least 100ms");
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
  ASSIGN_OR_RETURN(o.limits.pool_access,
                   AccessFlag("pool_access", absl::GetFlag(FLAGS_pool_access)));
  ASSIGN_OR_RETURN(o.config_pool_access,
                   AccessFlag("config_pool_access",
                              absl::GetFlag(FLAGS_config_pool_access)));
  ASSIGN_OR_RETURN(const gid_t shm_group,
                   ResolveGroup(absl::GetFlag(FLAGS_shm_group), "shm_group"));
  if (shm_group != static_cast<gid_t>(-1)) o.limits.shm_group = shm_group;
  return ReadCacheOptions(o);
}

// Whether HOST:PORT names a loopback interface (127.0.0.0/8, ::1, localhost).
bool IsLoopback(const std::string& host_port) {
  const std::string host = host_port.substr(0, host_port.rfind(':'));
  return absl::StartsWith(host, "127.") || host == "localhost" || host == "[::1]";
}

absl::Status ResolveAddress(DaemonOptions& o) {
  const std::string listen = absl::GetFlag(FLAGS_listen);
  if (!absl::StartsWith(listen, "unix:") &&
      (absl::StartsWith(listen, "/") || absl::StartsWith(listen, ".") ||
       absl::EndsWith(listen, ".sock"))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", listen, ": a socket path needs the unix: prefix "
        "(--listen=unix:", listen, "); TCP is tcp:PORT or HOST:PORT"));
  }
  // "tcp:PORT" means loopback; everything else is used as given.
  o.listen = absl::StartsWith(listen, "tcp:") ? "127.0.0.1:" + listen.substr(4)
                                              : listen;
  if (absl::StartsWith(o.listen, "unix:")) o.socket_path = o.listen.substr(5);
  if (!absl::numbers_internal::safe_strtou32_base(
          absl::GetFlag(FLAGS_socket_mode), &o.socket_mode, 8) ||
      o.socket_mode > 0777) {
    return absl::InvalidArgumentError(
        absl::StrCat("--socket_mode: '", absl::GetFlag(FLAGS_socket_mode),
                     "' is not an octal mode such as 0660"));
  }
  ASSIGN_OR_RETURN(o.socket_gid,
                   ResolveGroup(absl::GetFlag(FLAGS_socket_group)));
  const std::string token_file = absl::GetFlag(FLAGS_auth_token_file);
  if (!token_file.empty()) {
    ASSIGN_OR_RETURN(o.auth_token,
                     ReadSecretFile("auth_token_file", token_file, "a token"));
  }
  // README's Trust model: over TCP every call carries the token. Loopback
  // (tcp:PORT) may go without one, with a warning at start, for tests and
  // single-user machines; another interface may not.
  if (o.socket_path.empty() && o.auth_token.empty() && !IsLoopback(o.listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", listen, " is not loopback: it needs --auth_token_file "
        "(every TCP call then carries the token); tcp:PORT (127.0.0.1) may go "
        "without"));
  }
  o.health.auth_token = o.auth_token;
  o.health.probe_without_token =
      absl::GetFlag(FLAGS_health_probe_without_token);
  o.health.max_watches = absl::GetFlag(FLAGS_max_health_watches);
  if (o.health.max_watches < 0 || o.health.max_watches > 65536) {
    return absl::InvalidArgumentError(
        "--max_health_watches must be in [0, 65536]");
  }
  return absl::OkStatus();
}

absl::StatusOr<DaemonOptions> ReadOptionsFromFlags() {
  DaemonOptions o;
  RETURN_IF_ERROR(ResolveAddress(o));
  ASSIGN_OR_RETURN(
      o.budget, ByteFlag("memory_budget", absl::GetFlag(FLAGS_memory_budget)));
  ASSIGN_OR_RETURN(o.reserve, ByteFlag("memory_reserve",
                                       absl::GetFlag(FLAGS_memory_reserve)));
  const uint64_t host_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                              static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (o.budget > host_bytes) {
    spdlog::warn("--memory_budget {} is more than this host's memory ({}): pools "
                 "are still refused past the available memory minus "
                 "--memory_reserve",
                 FormatBytes(o.budget), FormatBytes(host_bytes));
  }
  ASSIGN_OR_RETURN(o.limits.max_page_io_bytes,
                   ByteFlag("max_page_io", absl::GetFlag(FLAGS_max_page_io)));
  ASSIGN_OR_RETURN(o.grpc_memory,
                   ByteFlag("grpc_memory", absl::GetFlag(FLAGS_grpc_memory)));
  if (o.grpc_memory < 4 * o.limits.max_page_io_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--grpc_memory ", FormatBytes(o.grpc_memory),
        " must be at least 4 x --max_page_io (",
        FormatBytes(4 * o.limits.max_page_io_bytes),
        "): a few page reads and writes must fit at once"));
  }
  o.limits.reserved_segment_prefix = "/hostkv.";
  o.limits.allow_unverified_shm_names =
      absl::GetFlag(FLAGS_allow_unverified_shm_names);
  o.limits.session_lease = absl::GetFlag(FLAGS_session_lease);
  RETURN_IF_ERROR(ReadTenantLimits(o));
  RETURN_IF_ERROR(ReadDescriptorLimits(o));
  RETURN_IF_ERROR(ReadPoolFillFlags(o));
  if (o.limits.session_lease < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--session_lease must be at least 1s");
  }
  o.signal_records = absl::GetFlag(FLAGS_signal_records);
  if (o.signal_records < 1 || o.signal_records > 65536) {
    return absl::InvalidArgumentError("--signal_records must be in [1, 65536]");
  }
  o.cuda = absl::GetFlag(FLAGS_cuda);
  if (o.cuda != "auto" && o.cuda != "on" && o.cuda != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda: '", o.cuda, "' is not one of auto, on, off"));
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
  o.gpu.wait_timeout = absl::GetFlag(FLAGS_gpu_wait_timeout);
  if (o.gpu.wait_timeout < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError(
        "--gpu_wait_timeout must be at least 100ms");
  }
  o.gpu.dma_prefer_overlap = absl::GetFlag(FLAGS_dma_prefer_overlap);
  const int threads = absl::GetFlag(FLAGS_copy_threads);
  if (threads < 0 || threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--copy_threads must be in [0, 1024] (0 = one per CPU but one, at most ",
        kMaxDefaultCopyThreads, "), got ", threads));
  }
  o.copy_threads = threads > 0 ? static_cast<unsigned>(threads)
                               : DefaultCopyThreads(UsableCpus());
  o.config_path = absl::GetFlag(FLAGS_config);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  const std::string metrics_token_file =
      absl::GetFlag(FLAGS_metrics_token_file);
  if (!metrics_token_file.empty()) {
    ASSIGN_OR_RETURN(
        o.metrics_token,
        ReadSecretFile("metrics_token_file", metrics_token_file, "a token"));
  }
  o.metrics_namespace_names = absl::GetFlag(FLAGS_metrics_namespace_names);
  o.keep_state = absl::GetFlag(FLAGS_keep_state);
  o.discard_state = absl::GetFlag(FLAGS_discard_state);
  o.takeover = absl::GetFlag(FLAGS_takeover);
  if (o.takeover && (o.socket_path.empty() || !o.keep_state || o.discard_state)) {
    return absl::InvalidArgumentError(
        "--takeover needs a unix: --listen socket and --keep_state, without "
        "--discard_state: it adopts the state of the daemon it replaces");
  }
  o.state_keep_for = absl::GetFlag(FLAGS_state_keep_for);
  if (o.state_keep_for < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        "--state_keep_for must be at least 1s (e.g. 10m)");
  }
  ASSIGN_OR_RETURN(o.tier, ReadTierFlags());
  RETURN_IF_ERROR(ReadRingAndMetricsBounds(o));
  RETURN_IF_ERROR(ReadDigestFlags(o));
  return o;
}

}  // namespace

absl::StatusOr<DaemonOptions> ReadDaemonOptions() {
  absl::StatusOr<DaemonOptions> o = ReadOptionsFromFlags();
  if (!o.ok()) return WithFlagOrigin(o.status());
  return o;
}

const std::vector<std::string>& DaemonFlagNames() {
  static const std::vector<std::string>* names = [] {
    auto* all = new std::vector<std::string>(kFlagNames);
    all->insert(all->end(), TierFlagNames().begin(), TierFlagNames().end());
    all->insert(all->end(), kDescriptorFlagNames.begin(),
                kDescriptorFlagNames.end());
    all->insert(all->end(), kDigestFlagNames.begin(), kDigestFlagNames.end());
    all->insert(all->end(), kPoolFillFlagNames.begin(), kPoolFillFlagNames.end());
    return all;
  }();
  return *names;
}

std::vector<std::string> KeeperLoggingArgs() {
  return {"--log_level=" + absl::GetFlag(FLAGS_log_level),
          "--log_format=" + absl::GetFlag(FLAGS_log_format)};
}

std::string StateKeeperFlag() { return absl::GetFlag(FLAGS_state_keeper); }
absl::Duration StateKeepForFlag() { return absl::GetFlag(FLAGS_state_keep_for); }

absl::Status SetUpLoggingFromFlags() {
  return SetUpLogging(absl::GetFlag(FLAGS_log_level),
                      absl::GetFlag(FLAGS_log_format));
}

unsigned DefaultCopyThreads(unsigned cpus) {
  return std::clamp(cpus > 1 ? cpus - 1 : 1u, 1u, kMaxDefaultCopyThreads);
}

}  // namespace hostkv
