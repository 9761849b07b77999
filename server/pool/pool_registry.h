// The daemon's pools by name.
#ifndef HOSTKV_SERVER_POOL_POOL_REGISTRY_H_
#define HOSTKV_SERVER_POOL_POOL_REGISTRY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "hostkv/v1/hostkv.pb.h"
#include "server/transfer/gpu_backend.h"
#include "server/pool/host_pool.h"
#include "server/pool/memory_budget.h"
#include "server/pool/pool_access.h"

namespace hostkv {

// What one owner (a uid, or all unverified sessions together) may create.
// Pools of the daemon's --config do not count.
struct PoolQuota {
  uint32_t max_pools_per_uid = 16;
  uint64_t max_pool_bytes_per_uid = 0;  // 0: only the memory budget caps
};

class PoolLedger;   // server/state/pool_ledger.h
class StateKeeper;  // server/state/state_keeper.h

// What adopting one pool kept and dropped (PoolRegistry::Adopt).
struct PoolAdoption {
  uint64_t pages_owned = 0;     // sessions' pages kept
  uint64_t pages_cached = 0;    // cached pages kept, with their keys
  uint64_t pages_dropped = 0;   // zeroed and freed: unproven, or their owner
                                // did not survive
  uint64_t keys_dropped = 0;    // records unproven, of an unowned namespace,
                                // or of a page not the cache's
};

// The state keeper's names of a pool's memfds.
std::string PoolSegmentKeepName(const std::string& pool);
std::string PoolLedgerKeepName(const std::string& pool);

// Thread-safe. Pools are shared_ptrs so that copies in flight keep a deleted
// pool's memory alive until they finish.
class PoolRegistry {
 public:
  // Segments are sealed memfds labelled "<segment_prefix>pool.<name>"
  // (without the prefix's '/'), filled with `fill` after each Create
  // returns (HostPool::Create). With `gpu` (may be
  // null), every pool is registered with CUDA in the background after it is
  // created, in chunks of whole pool pages.
  PoolRegistry(MemoryBudget* budget, std::string segment_prefix,
               PoolFillOptions fill, GpuBackend* gpu = nullptr,
               PoolQuota quota = {}, CacheOptions cache_options = {});
  // Stops notifying, then destroys the pools (joining pinning threads).
  ~PoolRegistry();

  // Creates pool spec.name() owned by `owner`. If it exists: returns it
  // when attach_if_exists and the spec is identical and `who` may use it
  // (else PermissionDenied), else AlreadyExists. ResourceExhausted, naming
  // the flag, past the owner's PoolQuota. Errors of ResolvePoolSpec, the
  // budget (ResourceExhausted) or the segment.
  absl::StatusOr<std::shared_ptr<HostPool>> Create(const v1::PoolSpec& spec,
                                                   bool attach_if_exists,
                                                   const v1::PoolOwner& owner,
                                                   const Principal& who)
      ABSL_LOCKS_EXCLUDED(mu_, create_mu_);

  // From now on every pool created gets a ledger, and its segment and
  // ledger are deposited with `keeper` (removed when it is deleted). Set
  // before the registry is shared; null: pools do not survive the daemon.
  void set_keeper(StateKeeper* keeper) { keeper_ = keeper; }
  // The daemon's namespace owners (every pool's).
  NamespaceOwners& namespaces() const { return *cache_options_.namespaces; }

  // Adopts the pool a previous daemon left: `segment` is its memfd,
  // `ledger` its ledger. Keeps the pages of sessions in `live_sessions`
  // and the cached pages whose records are proven and whose namespace has
  // an owner (NamespaceOwners); zeroes and frees the rest. The pool is
  // pinned again in the background (GPU backend), as at Create.
  // AlreadyExists, budget errors, FailedPrecondition for a segment that
  // does not match the ledger's geometry.
  absl::StatusOr<std::shared_ptr<HostPool>> Adopt(
      std::unique_ptr<PoolLedger> ledger, ScopedFd segment,
      const absl::flat_hash_set<OwnerTag>& live_sessions, PoolAdoption* report)
      ABSL_LOCKS_EXCLUDED(mu_, create_mu_);

  // Returns NotFound if no pool has this name.
  absl::StatusOr<std::shared_ptr<HostPool>> Get(const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // All pools, by name.
  std::vector<std::shared_ptr<HostPool>> List() const ABSL_LOCKS_EXCLUDED(mu_);

  // Deletes an empty pool. NotFound if unknown; PermissionDenied unless
  // `who` may (CheckPoolAdmin); FailedPrecondition while pages are
  // allocated or device buffers are registered against it.
  absl::Status Delete(const std::string& name, const Principal& who)
      ABSL_LOCKS_EXCLUDED(mu_, keep_mu_);

  // Called with (name, serving): true once a pool is ready to use (created,
  // and pinned when there is a GPU backend), false while it is being
  // pinned, if pinning failed, and after it is deleted (e.g. to publish
  // per-pool health).
  using Observer = std::function<void(const std::string& pool, bool serving)>;
  // Sets the observer and tells it the state of every existing pool. Once
  // it returns, the previous observer is no longer called (so it may be
  // destroyed); nullptr stops notifications.
  void SetObserver(Observer observer) ABSL_LOCKS_EXCLUDED(mu_, notify_mu_);

 private:
  // `options` with the daemon's one NamespaceOwners (every pool shares it).
  static CacheOptions WithNamespaceOwners(CacheOptions options);
  // Removes an unused pool from the map and returns it.
  absl::StatusOr<std::shared_ptr<HostPool>> DeleteLocked(
      const std::string& name, const Principal& who)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK if `owner` may add a pool of `bytes`.
  absl::Status CheckQuota(const v1::PoolOwner& owner, uint64_t bytes) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Reserves the page cache's metadata and ledger, charges references and
  // starts pinning; then the pool is published in pools_.
  absl::StatusOr<std::shared_ptr<HostPool>> Publish(
      std::unique_ptr<HostPool> pool, const v1::PoolOwner& owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(create_mu_);
  // Tells the observer whether pool `name` is serving now.
  void Notify(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_, notify_mu_);

  MemoryBudget* const budget_;
  const std::string segment_prefix_;
  const PoolFillOptions fill_;
  GpuBackend* const gpu_;
  const PoolQuota quota_;
  const CacheOptions cache_options_;
  StateKeeper* keeper_ = nullptr;

  absl::Mutex create_mu_;  // serializes creations (which can be slow)
  // Held from a pool's entry in pools_ to its descriptors in the keeper
  // (Publish: deposit, then insert; Delete: erase, then remove), so that
  // a deletion's removal cannot take the descriptors that a creation of
  // the same name deposited meanwhile. Before mu_.
  absl::Mutex keep_mu_;
  absl::Mutex notify_mu_;  // serializes observer calls
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<HostPool>> pools_
      ABSL_GUARDED_BY(mu_);
  Observer observer_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_POOL_REGISTRY_H_
