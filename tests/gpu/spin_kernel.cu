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

cudaError_t CyclesFor(double milliseconds, int device, long long* cycles) {
  int khz = 0;  // peak SM clock in kHz: cycles per millisecond
  const cudaError_t error =
      cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device);
  if (error != cudaSuccess) return error;
  if (khz <= 0) khz = 2000000;  // 2 GHz when the device does not say
  *cycles = static_cast<long long>(milliseconds * khz);
  return cudaSuccess;
}

cudaError_t LaunchSpinKernel(double milliseconds, int device,
                             cudaStream_t stream) {
  long long cycles = 0;
  const cudaError_t error = CyclesFor(milliseconds, device, &cycles);
  if (error != cudaSuccess) return error;
  SpinKernel<<<1, 1, 0, stream>>>(cycles);
  return cudaGetLastError();
}

cudaError_t LaunchBusyKernel(double milliseconds, int device,
                             cudaStream_t stream) {
  long long cycles = 0;
  cudaError_t error = CyclesFor(milliseconds, device, &cycles);
  if (error != cudaSuccess) return error;
  int sms = 0;
  error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (error != cudaSuccess) return error;
  // Two blocks of 1024 threads per SM: every SM's thread slots taken.
  SpinKernel<<<2 * (sms > 0 ? sms : 1), 1024, 0, stream>>>(cycles);
  return cudaGetLastError();
}

}  // namespace hostkv::gpu_testing
