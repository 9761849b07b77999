// Which storage tier the daemon puts under its page cache, and how it uses
// it (server/README.md, "Storage tiers"): the --tier URL and the --tier_* flags.
#ifndef HOSTKV_SERVER_TIER_TIER_CONFIG_H_
#define HOSTKV_SERVER_TIER_TIER_CONFIG_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/tier/page_tier.h"

namespace hostkv {

struct TierConfig {
  // Empty: no tier. Else one of
  //   redis://HOST:PORT[,HOST:PORT...]   Redis or Valkey; a cluster when
  //                                      several seeds are given or the one
  //                                      server says cluster_enabled:1
  //   redis-cluster://HOST:PORT[,...]    a cluster, without detection
  //   redis+unix:/PATH                   Redis on a Unix socket
  //   file:/PATH                         a directory (local or shared FS)
  std::string url;
  std::string password;  // Redis AUTH (from --tier_password_file)
  // Each store call (Redis: each socket read and write; connect too).
  absl::Duration timeout = absl::Seconds(2);
  uint32_t connections = 8;  // Redis connections per server
  bool fsync = true;         // file tier: fdatasync before a put counts

  // Write-behind: published pages are written after `write_after_hits`
  // lookup hits (0: at publish); never with read_only. Pages waiting for
  // the writer, in bytes: past write_queue_bytes a write is dropped (and
  // counted). Writer threads, and pages per store call.
  uint32_t write_after_hits = 0;
  bool read_only = false;
  uint64_t write_queue_bytes = 256ull << 20;
  uint32_t write_threads = 2;
  uint32_t write_batch_pages = 8;

  // Read-through: a Lookup that misses asks the tier for up to fetch_pages
  // keys that follow its hits and waits for them at most fetch_wait (and
  // never past the caller's deadline). Fetches run on fetch_threads.
  uint32_t fetch_pages = 64;
  // ... and at most this many bytes of pages (at least one page): the
  // values a fetch holds at once.
  uint64_t fetch_max_bytes = 64ull << 20;
  absl::Duration fetch_wait = absl::Seconds(1);
  uint32_t fetch_threads = 4;

  // While the tier is down, how often it is probed (it comes back by
  // itself).
  absl::Duration probe_interval = absl::Seconds(1);
};

// InvalidArgument naming what is wrong with a config (URL syntax, zero
// threads, ...); OK for an empty URL.
absl::Status CheckTierConfig(const TierConfig& config);

// Opens the store that config.url names. InvalidArgument for a bad URL;
// Unimplemented for redis:// in a daemon built without hiredis; the
// store's own errors (FileTier: a missing directory; Redis: a refused
// password). A Redis that is down is not an error: the tier connects when
// it comes up.
absl::StatusOr<std::unique_ptr<PageTier>> OpenTier(const TierConfig& config);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_TIER_CONFIG_H_
