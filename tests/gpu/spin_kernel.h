// A kernel that keeps a CUDA stream busy for a while, for the GPU tests that
// check what happens after work the engine has queued but not yet run.
#ifndef HOSTKV_TESTS_GPU_SPIN_KERNEL_H_
#define HOSTKV_TESTS_GPU_SPIN_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace hostkv::gpu_testing {

// Enqueues on `stream` one thread that spins for about `milliseconds` of
// wall time: clock64() cycles at the device's peak SM clock
// (cudaDevAttrClockRate), so at most that long plus any time the kernel is
// switched out. Returns the launch error.
cudaError_t LaunchSpinKernel(double milliseconds, int device,
                             cudaStream_t stream);

// The same with every SM's thread slots taken (two blocks of 1024 threads
// per SM): a stand-in for an engine's compute running beside the copies.
cudaError_t LaunchBusyKernel(double milliseconds, int device,
                             cudaStream_t stream);

}  // namespace hostkv::gpu_testing

#endif  // HOSTKV_TESTS_GPU_SPIN_KERNEL_H_
