// Makes a new pool's memory resident in the background, chunk by chunk on
// a few threads, and hands each chunk's pages over as soon as they are.
#ifndef HOSTKV_SERVER_POOL_POOL_FILL_H_
#define HOSTKV_SERVER_POOL_POOL_FILL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "hostkv/v1/hostkv.pb.h"
#include "kernels/pool_geometry.h"
#include "server/pool/fill_plan.h"
#include "server/pool/huge_pages.h"
#include "server/pool/numa_node.h"
#include "server/pool/resident_range.h"

namespace hostkv {

// How pools' memory is made and filled (daemon flags).
struct PoolFillOptions {
  unsigned threads = 1;               // at most this many at once per pool
  uint64_t chunk_bytes = 64ull << 20;  // pages handed over per chunk
  // Pools that do not say (PoolSpec.hugepages): --pool_hugepages.
  HugePageMode hugepages = HugePageMode::kAuto;
  std::string sysfs_root = "/sys";  // where the kernel's offer is read
  // The node of pools that ask "auto" or nothing (--numa_node, resolved at
  // start), or of this pool (HostPool::Create); kNoNode: unbound.
  int numa_node = kNoNode;
};

// Owns its threads; thread-safe. Destroying it (or Stop) stops the threads
// after the chunk each is filling.
class PoolFill {
 public:
  // Called on a filling thread with each chunk's pages once they are
  // resident, in no particular order; then `done` once, with OK or the first
  // error (Cancelled after Stop), on the last thread to finish.
  using ChunkReady = std::function<void(const PageRun& chunk)>;
  using Done = std::function<void(const absl::Status& status)>;

  // Starts filling pages [0, g.num_pages()) of the segment mapped at `base`
  // (memory reserved through `reserve_fd` first when >= 0: see MakeResident)
  // with min(options.threads, chunks) threads, bound to options.numa_node
  // when there is one (BindThreadToNode).
  PoolFill(std::string pool, const PoolGeometry& g, uint8_t* base,
           int reserve_fd, const PoolFillOptions& options, ChunkReady ready,
           Done done);
  ~PoolFill();

  struct Progress {
    v1::FillState state = v1::FILL_FILLING;
    uint64_t ready_pages = 0;
    uint64_t total_pages = 0;
    absl::Duration elapsed;
    std::string error;   // FILL_FAILED: why
    unsigned threads = 0;
    ResidentMethod method = ResidentMethod::kPopulate;  // kTouch if any chunk
  };
  Progress progress() const ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until every thread finished; the fill's result (Cancelled if
  // stopped first).
  absl::Status Wait() const ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the threads after their current chunk and waits for them; Wait()
  // returns from then on.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Work();
  // One chunk: OK, or the error that ends the fill.
  absl::Status FillChunk(const PageRun& chunk, ResidentMethod* method) const;
  void Finish(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string pool_;
  const PoolGeometry geometry_;
  uint8_t* const base_;
  const int reserve_fd_;
  const std::vector<PageRun> chunks_;
  const ChunkReady ready_;
  const Done done_;
  const absl::Time start_;
  const unsigned threads_;
  const int numa_node_;
  const std::string sysfs_root_;

  std::atomic<size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> touched_{false};

  mutable absl::Mutex mu_;
  uint64_t ready_pages_ ABSL_GUARDED_BY(mu_) = 0;
  unsigned running_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration elapsed_ ABSL_GUARDED_BY(mu_);

  std::vector<std::thread> workers_;  // last: start once the above exists
};

// The pool's fill state as the API reports it for a pool made resident
// before this daemon (adopted): ready, nothing to do.
PoolFill::Progress AdoptedFillProgress(uint64_t num_pages);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_POOL_FILL_H_
