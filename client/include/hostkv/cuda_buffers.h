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
//   (*signals)->AttachKvWord(*client, *import);  // the daemon's KV-written page
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

// cudaMalloc hands out small allocations from 2 MiB blocks of the driver's,
// and CUDA IPC shares (and a daemon opens) the whole block: memory meant for
// export is allocated in whole 2 MiB units, one allocation per buffer, as
// PyTorch's caching allocator does for its large blocks.
inline constexpr uint64_t kCudaIpcGranularity = uint64_t{2} << 20;
inline constexpr uint64_t RoundUpToIpcGranularity(uint64_t bytes) {
  return (bytes + kCudaIpcGranularity - 1) / kCudaIpcGranularity *
         kCudaIpcGranularity;
}

// Describes device memory [ptr, ptr + size) for RegisterDeviceBuffers: the
// IPC handle of the allocation holding it (cudaIpcGetMemHandle), the offset
// of ptr in that allocation (cuMemGetAddressRange), the device ordinal and
// UUID. InvalidArgument if the range leaves its allocation;
// FailedPrecondition if the memory cannot be exported (memory from the CUDA
// virtual memory API, e.g. PyTorch with expandable_segments:True).
absl::StatusOr<v1::DeviceBuffer> ExportCudaBuffer(const void* ptr,
                                                  uint64_t size);

// The GPU completion words of one import: num_layers uint64 words in device
// memory, exported to the daemon at registration (the daemon writes layer l's
// word after its copies), and the "KV written" word, which lives in a host
// page the daemon owns and passes over the session socket (AttachKvWord):
// the engine's stream writes its marks there, the daemon's stream waits on
// it, and the daemon releases a stuck wait with a CPU store.
// Thread-compatible. Destroy it only after the import is unregistered (or
// the client closed).
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

  // Fetches the "KV written" page of `import_id` (registered with buffer())
  // from the daemon over the session socket (Client::FetchKvWord), maps it
  // and registers it with CUDA (cudaHostRegister, mapped), so that
  // MarkKvWritten can write it. Call once per registration, before the first
  // MarkKvWritten; a later call replaces the page (a new registration of
  // these words). Errors of FetchKvWord, or Internal if the page cannot be
  // mapped or registered.
  absl::Status AttachKvWord(Client& client, uint64_t import_id);

  // Enqueues on `stream` a wait until layer `layer` of `op` is copied
  // (cuStreamWaitValue64 on the layer's word, no host round trip).
  // InvalidArgument if `op` does not cover `layer` or has no signal value
  // (an import registered without GPU signals).
  absl::Status WaitLayer(const Operation& op, uint32_t layer,
                         cudaStream_t stream) const;

  // Enqueues on `stream` a write of the next "KV written" value
  // (cuStreamWriteValue64 into the daemon's page) and returns it: a backup
  // with TransferOptions::wait_kv_written = that value starts after the work
  // enqueued on `stream` before this call. FailedPrecondition before
  // AttachKvWord.
  absl::StatusOr<uint64_t> MarkKvWritten(cudaStream_t stream);

  // Releases every wait on these words for good: writes 2^63 - 1 into every
  // layer word on `stream` (null: a stream of its own,
  // created at Create, so that a compute stream blocked in WaitLayer does
  // not hold the release up), then waits for the write. For when the daemon
  // is gone (Client::OnDaemonLost), and stores 2^63 - 1 into "KV written"
  // from the CPU: no layer word would move again, and
  // streams waiting on them would hang. Loads still waited for are then
  // garbage: check Client::Wait, which reports them failed. The words must
  // be zeroed before they are registered again.
  absl::Status ReleaseAll(cudaStream_t stream = nullptr);

  // Reads word `index` (a layer, or num_layers for "KV written": 0 before
  // AttachKvWord) from the host, synchronously; for tests and diagnostics.
  absl::StatusOr<uint64_t> ReadWord(uint32_t index) const;

 private:
  GpuSignals(uint32_t num_layers, int device, uint64_t* words);
  struct KvWordMapping;  // the daemon's page, mapped and registered

  const uint32_t num_layers_;
  const int device_;
  uint64_t* const words_;
  cudaStream_t release_stream_ = nullptr;
  uint64_t kv_written_ = 0;
  std::unique_ptr<KvWordMapping> kv_word_;
  v1::DeviceBuffer buffer_;
};

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_INCLUDE_HOSTKV_CUDA_BUFFERS_H_
