// hostkvd's flags: their definitions, and the checked options they make.
#ifndef HOSTKV_SERVER_OPERATIONS_DAEMON_OPTIONS_H_
#define HOSTKV_SERVER_OPERATIONS_DAEMON_OPTIONS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/strings/string_view.h"
#include "hostkv/v1/hostkv.pb.h"
#include "server/cache/digest_worker.h"
#include "server/pool/pool_registry.h"
#include "server/service/health_service.h"
#include "server/service/request_handler.h"
#include "server/sessions/session_monitor.h"
#include "server/sessions/session_registry.h"
#include "server/transfer/gpu_backend.h"

namespace hostkv {

// Everything the flags say, checked.
// Copy threads without --copy_threads: one per CPU the daemon may run on
// but one, at least 1, at most kMaxDefaultCopyThreads. CPU copies are bound
// by memory bandwidth: a socket's DRAM is saturated well before 8 threads
// copy at once. The CPU left over keeps the request threads (command
// rings, gRPC) and the engine's scheduler from waiting behind the copies:
// on the 2-vCPU VM of tests/bench a second copy thread halves a whole
// backup but makes the first layer of a load 2.4-2.9x later than SGLang's
// in-process copy (1 thread: 0.99x).
// The threads run only while a copy does, in slices that let other
// sessions' copies and the gRPC threads take their turns.
inline constexpr unsigned kMaxDefaultCopyThreads = 8;
unsigned DefaultCopyThreads(unsigned cpus);

struct DaemonOptions {
  std::string listen;       // resolved gRPC address
  std::string socket_path;  // empty for TCP
  uint32_t socket_mode = 0660;
  gid_t socket_gid = static_cast<gid_t>(-1);
  std::string auth_token;
  HealthOptions health;
  uint64_t budget = 0;
  uint64_t reserve = 0;
  // gRPC's resource quota: memory for requests in flight (--grpc_memory).
  uint64_t grpc_memory = uint64_t{1} << 30;
  unsigned copy_threads = 1;
  PoolFillOptions pool_fill;  // --pool_fill_threads, --pool_fill_chunk
  NumaRequest numa;           // --numa_node (main.cc resolves it)
  RequestLimits limits;
  int signal_records = 256;
  std::string cuda = "auto";
  GpuBackendOptions gpu;
  SessionLimits sessions;
  ConnectionLimits connections;
  // --max_grpc_connections_per_uid (GrpcListener); 0: no bound.
  uint32_t max_grpc_connections_per_uid = 256;
  // All uids' gRPC connections on the Unix socket: a share of the
  // descriptor limit (main.cc, descriptor_shares.h); 0: no bound.
  uint32_t max_grpc_connections = 0;
  // --namespace_release_after (ClaimSweeper's period); 0: never.
  absl::Duration namespace_release_after = absl::Seconds(60);
  PoolQuota quota;
  CacheOptions cache;  // page cache: namespace sharing, per-uid limits
  TierConfig tier;     // --tier, --tier_*: the storage tier under it
  PageDigestOptions digests;  // --page_digests, --verify_hits
  v1::PoolAccess config_pool_access = v1::POOL_ACCESS_GROUP;
  std::string config_path;     // --config
  std::string metrics_listen;  // --metrics_listen
  std::string metrics_token;   // from --metrics_token_file; empty: none asked
  bool metrics_namespace_names = false;  // --metrics_namespace_names
  // --metrics_connections_per_peer (the ring bounds are in `connections`).
  uint32_t metrics_connections_per_peer = 4;
  // The key of hashed /metrics labels: --metrics_label_key_file's, or
  // random at each start.
  std::string metrics_label_key;
  // Restarts (deploy/README.md "Restarts and upgrades").
  bool keep_state = true;      // --keep_state
  bool discard_state = false;  // --discard_state
  bool takeover = false;       // --takeover
  absl::Duration state_keep_for = absl::Minutes(10);
};

// Every flag by name, for the config file and HOSTKVD_<FLAG> sources.
const std::vector<std::string>& DaemonFlagNames();

// The parsed flags, checked; InvalidArgument naming the flag otherwise.
absl::StatusOr<DaemonOptions> ReadDaemonOptions();


// --state_keeper (the path to keep state on; empty: run as the daemon) and
// --state_keep_for, read before anything else.
std::string StateKeeperFlag();
// The logging flags, for the state keeper this daemon starts.
std::vector<std::string> KeeperLoggingArgs();
absl::Duration StateKeepForFlag();

// Sets up logging from --log_level and --log_format.
absl::Status SetUpLoggingFromFlags();

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_DAEMON_OPTIONS_H_
