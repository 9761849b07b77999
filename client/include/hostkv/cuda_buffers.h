// hostkv client library, CUDA side (library hostkv_client_cuda, built when
// nvcc is found): exporting device KV buffers to hostkvd and waiting for its
// per-layer completion on a CUDA stream.
//
//   // once, after allocating the KV cache:
//   std::vector<v1::DeviceBuffer> k, v;
//   for (int l = 0; l < layers; ++l) {
//     k.push_back(*ExportCudaBuffer(k_ptr[l], bytes));
//     v.push_back(*ExportCudaBuffer(v_ptr[l], bytes));
//   }
//   auto signals = GpuSignals::Create(layers, device);
//   auto import = client->RegisterDeviceBuffers("llama", slots, k, v,
//                                               &(*signals)->buffer());
//   // per batch: load, then each layer waits on the compute stream
//   auto op = client->Load("llama", *import, pages, slots);
//   for (int l = 0; l < layers; ++l) {
//     (*signals)->WaitLayer(*op, l, compute_stream);
//     attention_layer(l, compute_stream);
//   }
//   // backups start after the KV is written, without a host sync:
//   TransferOptions o;
//   o.wait_kv_written = *(*signals)->MarkKvWritten(compute_stream);
//   client->Backup("llama", *import, pages, slots, o);
//   // if hostkvd dies, let the engine's streams go:
//   client->OnDaemonLost([s = signals->get()] { s->ReleaseAll().IgnoreError(); });
#ifndef HOSTKV_CLIENT_INCLUDE_HOSTKV_CUDA_BUFFERS_H_
#define HOSTKV_CLIENT_INCLUDE_HOSTKV_CUDA_BUFFERS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "hostkv/client.h"
#include "hostkv/v1/hostkv.pb.h"

namespace hostkv {

// Describes device memory [ptr, ptr + size) for RegisterDeviceBuffers: the
// IPC handle of the allocation holding it (cudaIpcGetMemHandle), the offset
// of ptr in that allocation (cuMemGetAddressRange), the device ordinal and
// UUID. InvalidArgument if the range leaves its allocation;
// FailedPrecondition if the memory cannot be exported (memory from the CUDA
// virtual memory API, e.g. PyTorch with expandable_segments:True).
absl::StatusOr<v1::DeviceBuffer> ExportCudaBuffer(const void* ptr,
                                                  uint64_t size);

// The GPU completion words of one import: num_layers + 1 uint64 words in
// device memory, exported to the daemon at registration. Thread-compatible.
// Destroy it only after the import is unregistered (or the client closed).
class GpuSignals {
 public:
  // Allocates and zeroes the words on `device`. FailedPrecondition if the
  // device has no 64-bit stream memory operations.
  static absl::StatusOr<std::unique_ptr<GpuSignals>> Create(uint32_t num_layers,
                                                            int device);
  ~GpuSignals();
  GpuSignals(const GpuSignals&) = delete;
  GpuSignals& operator=(const GpuSignals&) = delete;

  // Pass as RegisterDeviceBuffers(..., gpu_signals).
  const v1::DeviceBuffer& buffer() const { return buffer_; }

  // Enqueues on `stream` a wait until layer `layer` of `op` is copied
  // (cuStreamWaitValue64 on the layer's word, no host round trip).
  // InvalidArgument if `op` does not cover `layer` or has no signal value
  // (an import registered without GPU signals).
  absl::Status WaitLayer(const Operation& op, uint32_t layer,
                         cudaStream_t stream) const;

  // Enqueues on `stream` a write of the next "KV written" value and
  // returns it: a backup with TransferOptions::wait_kv_written = that value
  // starts after the work enqueued on `stream` before this call.
  absl::StatusOr<uint64_t> MarkKvWritten(cudaStream_t stream);

  // Releases every wait on these words for good: writes 2^63 - 1 into every
  // layer word and "KV written" on `stream` (null: a stream of its own,
  // created at Create, so that a compute stream blocked in WaitLayer does
  // not hold the release up), then waits for the write. For when the daemon
  // is gone (Client::OnDaemonLost): no layer word would move again, and
  // streams waiting on them would hang. Loads still waited for are then
  // garbage: check Client::Wait, which reports them failed. The words must
  // be zeroed before they are registered again.
  absl::Status ReleaseAll(cudaStream_t stream = nullptr);

  // Reads word `index` (a layer, or num_layers for "KV written") from the
  // host, synchronously; for tests and diagnostics.
  absl::StatusOr<uint64_t> ReadWord(uint32_t index) const;

 private:
  GpuSignals(uint32_t num_layers, int device, uint64_t* words)
      : num_layers_(num_layers), device_(device), words_(words) {}

  const uint32_t num_layers_;
  const int device_;
  uint64_t* const words_;
  cudaStream_t release_stream_ = nullptr;
  uint64_t kv_written_ = 0;
  v1::DeviceBuffer buffer_;
};

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_INCLUDE_HOSTKV_CUDA_BUFFERS_H_
