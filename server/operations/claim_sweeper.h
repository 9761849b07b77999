// Gives back the cache-namespace claims nobody uses any more
// (NamespaceOwners::ReleaseUnused): a namespace in which no pool caches a
// page and whose owner has no session open. Its owner's
// --max_cache_namespaces_per_uid share and its daemon-ledger slot are free
// again, and the name may be claimed by the next user who publishes in it.
#ifndef HOSTKV_SERVER_OPERATIONS_CLAIM_SWEEPER_H_
#define HOSTKV_SERVER_OPERATIONS_CLAIM_SWEEPER_H_

#include <cstdint>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/pool/pool_registry.h"
#include "server/sessions/session_registry.h"

namespace hostkv {

// One sweep: the claims given back (unused at this sweep and the one
// before, see ReleaseUnused).
uint64_t SweepNamespaceClaims(PoolRegistry& pools, const SessionRegistry& sessions);

// Sweeps every `period` on a thread of its own until destroyed. A claim is
// given back between one and two periods after its last use.
class ClaimSweeper {
 public:
  ClaimSweeper(PoolRegistry* pools, const SessionRegistry* sessions,
               absl::Duration period);
  ~ClaimSweeper();

  uint64_t released() const;

 private:
  PoolRegistry* const pools_;
  const SessionRegistry* const sessions_;
  const absl::Duration period_;
  absl::Notification stop_;
  mutable absl::Mutex mu_;
  uint64_t released_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_CLAIM_SWEEPER_H_
