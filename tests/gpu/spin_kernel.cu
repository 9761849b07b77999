#include <cuda_runtime.h>

#include "tests/gpu/spin_kernel.h"

namespace hostkv::gpu_testing {
namespace {

__global__ void SpinKernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

cudaError_t LaunchSpinKernel(double milliseconds, int device,
                             cudaStream_t stream) {
  int khz = 0;  // peak SM clock in kHz: cycles per millisecond
  const cudaError_t error =
      cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device);
  if (error != cudaSuccess) return error;
  if (khz <= 0) khz = 2000000;  // 2 GHz when the device does not say
  SpinKernel<<<1, 1, 0, stream>>>(static_cast<long long>(milliseconds * khz));
  return cudaGetLastError();
}

}  // namespace hostkv::gpu_testing
