// HOSTKV_HD marks functions compiled for both the host and CUDA devices.
#ifndef HOSTKV_KERNELS_HOST_DEVICE_H_
#define HOSTKV_KERNELS_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define HOSTKV_HD __host__ __device__ __forceinline__
#else
#define HOSTKV_HD inline
#endif

#endif  // HOSTKV_KERNELS_HOST_DEVICE_H_
