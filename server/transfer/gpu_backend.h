// The daemon's CUDA side behind an interface free of CUDA types, so that the
// daemon builds without a CUDA toolkit and runs without a GPU. The CUDA
// implementation lives in server/cuda/; without CUDA, CreateGpuBackend says
// why there is none and the daemon serves the CPU backend alone.
#ifndef HOSTKV_SERVER_TRANSFER_GPU_BACKEND_H_
#define HOSTKV_SERVER_TRANSFER_GPU_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hostkv/v1/hostkv.pb.h"
#include "proto/contract/shm_segment.h"
#include "server/pool/slot_allocator.h"
#include "server/transfer/signal_sequence.h"

namespace hostkv {

class DeviceImport;
class HostPool;
struct TransferOp;

// The registration of one pool's memory with CUDA (cudaHostRegister, in
// chunks), which runs in the background. Thread-safe. Destroying it stops
// the pinning and unregisters every chunk.
class PoolPinning {
 public:
  struct Progress {
    v1::PinState state = v1::PIN_NOT_NEEDED;
    uint64_t pinned_bytes = 0;
    uint64_t total_bytes = 0;
    absl::Duration elapsed;
    std::string error;  // PIN_FAILED: why
  };

  virtual ~PoolPinning() = default;
  virtual Progress progress() const = 0;
  bool pinned() const { return progress().state == v1::PIN_PINNED; }
  // The pool's base address as GPU kernels address it
  // (cudaHostGetDevicePointer); null until pinned, or when the chunks' device
  // addresses are not one contiguous range (kernels then cannot be used).
  virtual uint8_t* device_base() const = 0;
  // Registrations start at multiples of this many bytes from the pool's
  // base (0: one registration covers the pool). A copy-engine copy must not
  // cross such a boundary.
  virtual uint64_t chunk_bytes() const = 0;
};

// One device buffer named by a CUDA IPC handle (validated).
struct GpuBufferRef {
  std::string ipc_handle;   // 64 bytes
  uint64_t offset = 0;
  uint64_t size = 0;
  int32_t device = 0;       // ordinal in the client's process
  std::string device_uuid;  // 16 bytes or empty
};

struct GpuImportSpec {
  uint64_t token_slots = 0;
  std::vector<GpuBufferRef> k;  // one per layer (MLA: the latent)
  std::vector<GpuBufferRef> v;  // one per layer (MHA), none (MLA)
  // The per-layer words: num_layers uint64 in the engine's device memory
  // (a buffer of num_layers + 1 words, as before, is accepted). "KV
  // written" is not among them: it is a KvWordPage the daemon creates.
  std::optional<GpuBufferRef> signals;
};

// The CUDA state of one import: its mappings, stream and signal words.
// Thread-safe.
class GpuImportState {
 public:
  virtual ~GpuImportState() = default;
  virtual int device() const = 0;
  virtual bool has_signals() const = 0;
  // The value the next operation's layers will signal: one above the last
  // value given out or claimed (the first is one above what the words held
  // at registration). FailedPrecondition once the last is kMaxSignalValue
  // (SignalSequence::Next). Called in submission order
  // (TransferEngine::Submit).
  virtual absl::StatusOr<uint64_t> NextSignalValue() = 0;
  // Makes `value` (a client's TransferRequest.signal_value) the last value,
  // atomically, for the operation being submitted; NextSignalValue
  // continues above it. Returns InvalidArgument, and changes nothing,
  // unless `value` is above the last value and at most kMaxSignalValue
  // (SignalSequence::Claim). REQUIRES: has_signals(); called in submission
  // order, as NextSignalValue.
  virtual absl::Status ClaimSignalValue(uint64_t value) = 0;
  // The session is ending or the import is unregistered: lets backups that
  // wait for "KV written" proceed so they do not block the stream forever
  // (a CPU store into the import's KvWordPage).
  virtual void ReleaseWaits() = 0;
  // A duplicate of the memfd of the import's "KV written" page, for the
  // engine (SessionMessageKind::kFetchKvWord). FailedPrecondition if the
  // import was registered without gpu_signals; Internal if dup fails.
  virtual absl::StatusOr<ScopedFd> FetchKvWord() const = 0;
};

class DaemonMetrics;

struct GpuBackendOptions {
  DaemonMetrics* metrics = nullptr;  // may be null
  // Pools are registered with CUDA in chunks of about this many bytes.
  uint64_t pin_chunk_bytes = 1ull << 30;
  // Blocks per copy kernel launch (0: the kernel's default).
  unsigned kernel_blocks = 0;
  // A transfer still waiting for the engine's mark (wait_kv_written) after
  // this long has its import's waits released and is reported failed, so
  // that no wait -- and no Close/Unregister behind it -- lasts forever.
  absl::Duration wait_timeout = absl::Seconds(60);
  // DIRECT copies set cudaMemcpyFlagPreferOverlapWithCompute.
  bool dma_prefer_overlap = true;
  // Called once if the CUDA context fails for good (a device fault): the
  // GPU backend then refuses work and the daemon should be restarted.
  std::function<void(const std::string& why)> on_fatal;
};

// Thread-safe.
class GpuBackend {
 public:
  virtual ~GpuBackend() = default;

  // The devices, for logs ("1 device: 0 NVIDIA H200 (sm_90, 139.8 GiB)").
  virtual std::string Describe() const = 0;
  // The PCI bus id of device 0 ("0000:3B:00.0"), where pools' memory goes
  // by default (--numa_node=auto); empty if unknown.
  virtual std::string PciBusId() const { return ""; }

  // Starts pinning [base, base + bytes) in chunks whose sizes are multiples
  // of `align` (so that no pool page straddles two registrations), once
  // `wait_resident` (called on the pinning thread first; may be null)
  // returned OK: the pool's memory is resident, so registering it faults
  // nothing in. Its error fails the pinning. `done(ok)` runs on the
  // pinning thread when it finishes.
  virtual std::unique_ptr<PoolPinning> StartPinning(
      const std::string& pool, uint8_t* base, uint64_t bytes, uint64_t align,
      std::function<absl::Status()> wait_resident,
      std::function<void(bool ok)> done) = 0;

  // Opens the buffers of a registration (CUDA IPC), checks each against its
  // allocation and the pool's geometry. InvalidArgument for bad sizes or
  // ranges, NotFound for an unknown device, FailedPrecondition when a handle
  // cannot be opened (with CUDA's reason).
  virtual absl::StatusOr<std::unique_ptr<DeviceImport>> OpenImport(
      std::shared_ptr<HostPool> pool, const GpuImportSpec& spec) = 0;

  // Enqueues `op` (whose import is this backend's) on the import's stream
  // and returns; the op finishes (signals, unpins) when the GPU is done. On
  // error the op is finished as failed and the error returned.
  virtual absl::Status Enqueue(std::unique_ptr<TransferOp> op) = 0;

  // Blocks until no operation of `owner` (every owner if nullopt) is in
  // flight on the GPU.
  virtual void AwaitIdle(std::optional<OwnerTag> owner) = 0;
};

// The CUDA backend. NotFound when there is no usable device or driver,
// Unimplemented when hostkvd was built without CUDA. Makes no CUDA call
// before it has counted the devices.
absl::StatusOr<std::unique_ptr<GpuBackend>> CreateGpuBackend(
    const GpuBackendOptions& options);

// For --version: whether this build has the CUDA backend, and with which
// runtime, driver and devices it would run here.
std::string DescribeGpuSupport();

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TRANSFER_GPU_BACKEND_H_
