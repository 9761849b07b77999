// The engine side of the GPU tests and the GPU benchmark: what an inference
// engine process holds (a device KV cache in cudaMalloc'd memory, exported
// for hostkvd; streams) and the hostkvd process it talks to (--cuda=on).
#ifndef HOSTKV_TESTS_GPU_GPU_ENGINE_H_
#define HOSTKV_TESTS_GPU_GPU_ENGINE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hostkv/client.h"
#include "hostkv/v1/hostkv.pb.h"
#include "tests/testing/daemon_process.h"

namespace hostkv::gpu_testing {

// A bf16 pool: MHA (layers, heads x dim) or MLA (layers, one latent of dim
// = kv_lora_rank dim - 64 + rope 64).
v1::PoolSpec Bf16PoolSpec(const std::string& name, bool mla, uint32_t layers,
                          uint32_t heads, uint32_t dim, v1::Layout layout,
                          uint32_t page_size, uint64_t capacity_tokens);

// True when CUDA reports at least one device; otherwise false, and *why says
// what cudaGetDeviceCount answered.
bool CudaDevicePresent(std::string* why);

// Owns one cudaMalloc allocation; move-only.
class DeviceMemory {
 public:
  static absl::StatusOr<DeviceMemory> Allocate(uint64_t bytes);
  DeviceMemory() = default;
  DeviceMemory(DeviceMemory&& other) noexcept { *this = std::move(other); }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  ~DeviceMemory();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Owns a non-blocking stream (so the synchronous cudaMemcpy calls of the
// tests, on the legacy stream, never wait for it); move-only.
class CudaStream {
 public:
  static absl::StatusOr<CudaStream> Create();
  CudaStream() = default;
  CudaStream(CudaStream&& other) noexcept { *this = std::move(other); }
  CudaStream& operator=(CudaStream&& other) noexcept;
  ~CudaStream();

  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Polls `stream` until its work is done. DeadlineExceeded after `timeout`
// (the work stays queued: the caller must not synchronize the device after
// that); Internal with CUDA's reason if the stream failed. Unlike
// cudaStreamSynchronize it cannot hang on a stream that waits for a GPU
// signal that never comes.
absl::Status AwaitStream(cudaStream_t stream, absl::Duration timeout);

// Polls GetPoolStats until `pool` is PIN_PINNED. FailedPrecondition with the
// daemon's pin_error if pinning failed; DeadlineExceeded after `timeout`.
absl::Status AwaitPinned(Client& client, const std::string& pool,
                         absl::Duration timeout);

// Starts hostkvd --cuda=on (plus `extra_args`, which may override it) on a
// private socket and waits up to `timeout` until it answers health checks:
// longer than DaemonProcess waits by itself, because initializing CUDA can
// take seconds on a GPU without persistence mode. Unavailable with the
// daemon's log if it exits or does not answer in time.
absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> StartCudaDaemon(
    const std::vector<std::string>& extra_args, absl::Duration timeout);

// The device KV cache of one pool: per layer a K and a V buffer (planes = 2)
// or one latent buffer (planes = 1), each token_slots rows of token_stride
// bytes.
struct KvCacheShape {
  uint32_t layers = 0;
  uint32_t planes = 2;
  uint64_t token_slots = 0;
  uint64_t token_stride = 0;
  // Buffers of layers >= shared_from live in one allocation, at non-zero
  // offsets with gaps between them; every second one of them is shifted by
  // `misalign` more bytes. The others have an allocation each.
  uint32_t shared_from = std::numeric_limits<uint32_t>::max();
  uint64_t misalign = 0;
};

// Owns the allocations of one KV cache and their exports for
// RegisterDeviceBuffers. Thread-compatible.
class EngineKvCache {
 public:
  // Where one buffer lives.
  struct Place {
    size_t allocation;
    uint64_t offset;
  };

  // Allocates the buffers on the current device and exports them
  // (ExportCudaBuffer). Errors of cudaMalloc and ExportCudaBuffer.
  static absl::StatusOr<std::unique_ptr<EngineKvCache>> Create(
      const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }
  uint64_t buffer_bytes() const {
    return shape_.token_slots * shape_.token_stride;
  }
  uint8_t* buffer(uint32_t kv, uint32_t layer) const;
  Place place(uint32_t kv, uint32_t layer) const {
    return places_[layer * shape_.planes + kv];
  }
  const std::vector<DeviceMemory>& allocations() const { return allocations_; }
  // For RegisterDeviceBuffers: k (or latent) per layer; v per layer or empty.
  const std::vector<v1::DeviceBuffer>& k() const { return k_; }
  const std::vector<v1::DeviceBuffer>& v() const { return v_; }

  // Sets every byte of every allocation (gaps included) to `byte`, then
  // waits for the device.
  absl::Status Fill(uint8_t byte) const;
  // Copies `bytes` (buffer_bytes() of them) into buffer (kv, layer), then
  // waits for the device.
  absl::Status Write(uint32_t kv, uint32_t layer,
                     const std::vector<uint8_t>& bytes) const;
  // The whole of allocation `index`.
  absl::StatusOr<std::vector<uint8_t>> ReadAllocation(size_t index) const;

 private:
  explicit EngineKvCache(const KvCacheShape& shape) : shape_(shape) {}

  const KvCacheShape shape_;
  std::vector<DeviceMemory> allocations_;
  std::vector<Place> places_;  // [layer * planes + kv]
  std::vector<v1::DeviceBuffer> k_, v_;
};

}  // namespace hostkv::gpu_testing

#endif  // HOSTKV_TESTS_GPU_GPU_ENGINE_H_
