// Runs CopyTasks on the CPU: the CPU backend's data path.
#ifndef HOSTKV_KERNELS_CPU_COPY_ENGINE_H_
#define HOSTKV_KERNELS_CPU_COPY_ENGINE_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "kernels/copy_plan.h"
#include "kernels/worker_pool.h"

namespace hostkv {

// Thread-safe; borrows `workers`, which must outlive it.
class CpuCopyEngine {
 public:
  explicit CpuCopyEngine(WorkerPool* workers);

  // Copies every token of `task` for one layer, split over the workers when
  // the layer is large enough to pay for it.
  void CopyLayer(const CopyTask& task, uint32_t layer) const;

  // Copies layers [layer_begin, layer_end) in one pass over the workers (no
  // barrier between layers): each worker copies its share of the tokens
  // layer after layer. layer_done(l) is called, on some worker, once every
  // worker has copied layer l, which implies all layers before l are done
  // too (calls for different layers may overlap and arrive out of order).
  // Before each layer each worker asks keep_going(); false stops it.
  // A backup (device to host) of more than one layer of a layout that
  // gains from it (HostOrderHelps) is walked in the host
  // pool's order instead (kernels/host_order_copy.h): each worker copies
  // every layer of its tokens, in as many steps as there are layers (asking
  // keep_going() before each), and its layers are done when its last step
  // is; layer_done then comes for every layer at the end.
  // Each slice is copied under a fault guard (kernels/fault_guard.h): if the
  // device memory vanishes under the copy (SIGBUS: a client truncated the
  // segment), every worker stops and DataLoss is returned, naming the
  // address; layers not fully copied are then never reported done. Returns
  // OK otherwise, including when keep_going() stopped it.
  absl::Status CopyLayers(const CopyTask& task, uint32_t layer_begin,
                  uint32_t layer_end, const std::function<bool()>& keep_going,
                  const std::function<void(uint32_t)>& layer_done) const;

 private:
  WorkerPool* const workers_;
};

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_CPU_COPY_ENGINE_H_
