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

// Thread-safe. Pools are shared_ptrs so that copies in flight keep a deleted
// pool's memory alive until they finish.
class PoolRegistry {
 public:
  // Segments are sealed memfds labelled "<segment_prefix>pool.<name>"
  // (without the prefix's '/'). With `gpu` (may be
  // null), every pool is registered with CUDA in the background after it is
  // created, in chunks of whole pool pages.
  PoolRegistry(MemoryBudget* budget, std::string segment_prefix,
               unsigned prefault_threads, GpuBackend* gpu = nullptr,
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

  // Returns NotFound if no pool has this name.
  absl::StatusOr<std::shared_ptr<HostPool>> Get(const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // All pools, by name.
  std::vector<std::shared_ptr<HostPool>> List() const ABSL_LOCKS_EXCLUDED(mu_);

  // Deletes an empty pool. NotFound if unknown; PermissionDenied unless
  // `who` may (CheckPoolAdmin); FailedPrecondition while pages are
  // allocated or device buffers are registered against it.
  absl::Status Delete(const std::string& name, const Principal& who)
      ABSL_LOCKS_EXCLUDED(mu_);

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
  // Tells the observer whether pool `name` is serving now.
  void Notify(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_, notify_mu_);

  MemoryBudget* const budget_;
  const std::string segment_prefix_;
  const unsigned prefault_threads_;
  GpuBackend* const gpu_;
  const PoolQuota quota_;
  const CacheOptions cache_options_;

  absl::Mutex create_mu_;  // serializes creations (which can be slow)
  absl::Mutex notify_mu_;  // serializes observer calls
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<HostPool>> pools_
      ABSL_GUARDED_BY(mu_);
  Observer observer_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_POOL_REGISTRY_H_
