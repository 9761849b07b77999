// Fills the occupancy messages of GetPoolStats from the daemon's state.
#ifndef HOSTKV_SERVER_OPERATIONS_STATS_REPORT_H_
#define HOSTKV_SERVER_OPERATIONS_STATS_REPORT_H_

#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "hostkv/v1/hostkv.pb.h"
#include "server/pool/host_pool.h"
#include "server/sessions/session.h"

namespace hostkv {

// Capacity, use and per-session usage of `pool` (sessions holding nothing in
// it are left out).
void FillPoolStats(const HostPool& pool,
                   const std::vector<std::shared_ptr<Session>>& sessions,
                   v1::PoolStats* stats);

// The page cache's counters of `pool`, per pool and per namespace;
// `cached_pages` from the allocator's snapshot (pages it owns for the cache,
// evicted ones still read by loads included).
void FillCacheStats(const HostPool& pool, uint64_t cached_pages,
                    v1::PoolStats* stats);

// The lookups of a namespace and why they missed (GetPoolStats,
// ExplainMisses).
void FillMissCounters(const MissCounters& c, v1::MissCounters* out);

// Identity, liveness and holdings of `session` across `pools`.
void FillSessionInfo(const Session& session,
                     const std::vector<std::shared_ptr<HostPool>>& pools,
                     absl::Time now, v1::SessionInfo* info);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_STATS_REPORT_H_
