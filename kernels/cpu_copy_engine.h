// Runs CopyTasks on the CPU: the CPU backend's data path.
#ifndef HOSTKV_KERNELS_CPU_COPY_ENGINE_H_
#define HOSTKV_KERNELS_CPU_COPY_ENGINE_H_

#include <cstdint>

#include "kernels/copy_plan.h"
#include "kernels/worker_pool.h"

namespace hostkv {

// Thread-safe; borrows `workers`, which must outlive it.
class CpuCopyEngine {
 public:
  explicit CpuCopyEngine(WorkerPool* workers) : workers_(workers) {}

  // Copies every token of `task` for one layer, split over the workers when
  // the layer is large enough to pay for it.
  void CopyLayer(const CopyTask& task, uint32_t layer) const;

 private:
  WorkerPool* const workers_;
};

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_CPU_COPY_ENGINE_H_
