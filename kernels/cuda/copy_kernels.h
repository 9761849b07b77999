// Host-callable launcher of the SM gather/scatter copy kernel (no CUDA
// headers here; `void* stream` is a cudaStream_t).
#ifndef HOSTKV_KERNELS_CUDA_COPY_KERNELS_H_
#define HOSTKV_KERNELS_CUDA_COPY_KERNELS_H_

#include "kernels/kernel_copy_plan.h"

namespace hostkv {

// Enqueues on `stream` the copy of one layer described by `args` (GPU
// pointers: host_base from cudaHostGetDevicePointer or UVA, token arrays in
// device memory, or pinned host memory read through UVA at a PCIe read per
// row per layer). Uses at most `max_blocks` blocks of 8 warps (0: 16 blocks),
// so as to leave the SMs to the engine. Launches nothing when num_tokens is 0.
// Returns the cudaError_t value (0 = ok): cudaErrorInvalidValue when a
// pointer the copy needs is null or the layer is out of range, else the
// launch error. The token indices themselves are not checked.
// REQUIRES: host_tokens[i] < token_slots and device_tokens[i] < the rows of
//           the device buffers, for every i < num_tokens.
int LaunchLayerCopyKernel(const KernelCopyArgs& args, unsigned max_blocks,
                          void* stream);

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_CUDA_COPY_KERNELS_H_
