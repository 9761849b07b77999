#include "server/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <iterator>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/driver_api.h"
#include "proto/contract/status_macros.h"
#include "server/cuda/cuda_import.h"
#include "server/cuda/cuda_pool_pinning.h"
#include "server/cuda/cuda_transfer.h"
#include "server/operations/daemon_metrics.h"
#include "server/transfer/device_import.h"
#include "server/pool/host_pool.h"
#include "server/sessions/signal_board.h"
#include "server/transfer/transfer_engine.h"
#include "spdlog/spdlog.h"

namespace hostkv {

absl::StatusOr<std::unique_ptr<GpuBackend>> CreateGpuBackend(
    const GpuBackendOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend,
                   CudaBackend::Create(options));
  return std::unique_ptr<GpuBackend>(std::move(backend));
}

std::string DescribeGpuSupport() {
  int runtime = 0;
  int driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  auto version = [](int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); };
  const std::string built =
      absl::StrCat("backends: cpu, cuda (CUDA runtime ", version(runtime), ")");
  if (driver == 0) {
    return absl::StrCat(built, "; no CUDA driver here: serves the CPU backend");
  }
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) cudaGetLastError();
  return absl::StrCat(built, "; driver ", version(driver), ", ",
                      error == cudaSuccess ? absl::StrCat(count, " device(s)")
                                           : std::string(cudaGetErrorString(error)));
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const GpuBackendOptions& options) {
  // The first CUDA call: counting devices also finds out whether there is a
  // driver at all.
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::NotFoundError(absl::StrCat(
        "no CUDA device (",
        error == cudaSuccess ? "none visible" : cudaGetErrorString(error),
        ")"));
  }
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  (void)api;
  std::unique_ptr<CudaBackend> backend(new CudaBackend(options));
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, i),
                               "cudaGetDeviceProperties"));
    backend->devices_.push_back(
        Device{i, std::string(prop.uuid.bytes, sizeof(prop.uuid.bytes)),
               prop.name, prop.major, prop.minor, prop.totalGlobalMem,
               Supports64BitStreamMemOps(i), false});
    int host_pointer = 0;
    if (cudaDeviceGetAttribute(&host_pointer,
                               cudaDevAttrCanUseHostPointerForRegisteredMem,
                               i) != cudaSuccess) {
      cudaGetLastError();
    }
    backend->devices_.back().host_pointer_for_registered_mem = host_pointer != 0;
    if (host_pointer == 0) {
      spdlog::info("device {} cannot use host pointers for registered "
                   "memory: DIRECT copies address pools through their "
                   "device mapping", i);
    }
    int mode = cudaComputeModeDefault;
    if (cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, i) != cudaSuccess) {
      cudaGetLastError();
    } else if (mode == cudaComputeModeExclusiveProcess ||
               mode == cudaComputeModeProhibited) {
      // The daemon and the engines must both hold a context on the device.
      spdlog::warn("device {} ({}) is in {} compute mode: hostkvd and the "
                   "engines cannot share it (set DEFAULT with nvidia-smi -c, "
                   "or run MPS)",
                   i, prop.name,
                   mode == cudaComputeModeProhibited ? "PROHIBITED"
                                                     : "EXCLUSIVE_PROCESS");
    }
  }
  return backend;
}

CudaBackend::CudaBackend(const GpuBackendOptions& options)
    : options_(options),
      completer_([this] { CompletionLoop(); }),
      watchdog_([this] { WatchdogLoop(); }) {}

CudaBackend::~CudaBackend() {
  AwaitIdle(std::nullopt);
  {
    absl::MutexLock lock(&done_mu_);
    stopping_ = true;
  }
  completer_.join();
  watchdog_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [owner, last] : last_op_) cudaEventDestroy(last.event);
}

std::string CudaBackend::PciBusId() const {
  char id[64] = {0};
  if (devices_.empty() ||
      cudaDeviceGetPCIBusId(id, sizeof(id), devices_[0].ordinal) != cudaSuccess) {
    cudaGetLastError();  // not sticky: cleared
    return "";
  }
  return id;
}

std::string CudaBackend::Describe() const {
  std::string out = absl::StrCat(devices_.size(), " CUDA device",
                                 devices_.size() == 1 ? "" : "s", ":");
  for (const Device& d : devices_) {
    absl::StrAppendFormat(&out, " [%d %s sm_%d%d %.1f GiB%s]", d.ordinal,
                          d.name, d.major, d.minor,
                          static_cast<double>(d.memory) / (1ull << 30),
                          d.stream_mem_ops64 ? "" : " no-64-bit-stream-memops");
  }
  return out;
}

std::unique_ptr<PoolPinning> CudaBackend::StartPinning(
    const std::string& pool, uint8_t* base, uint64_t bytes, uint64_t align,
    std::function<absl::Status()> wait_resident,
    std::function<void(bool ok)> done) {
  return std::make_unique<CudaPoolPinning>(
      pool, base, bytes, PlanPinChunks(bytes, align, options_.pin_chunk_bytes),
      std::move(wait_resident), std::move(done));
}

absl::StatusOr<int> CudaBackend::ResolveDevice(const GpuBufferRef& ref,
                                               const std::string& where) const {
  if (!ref.device_uuid.empty()) {
    for (const Device& d : devices_) {
      if (d.uuid == ref.device_uuid) return d.ordinal;
    }
    return absl::NotFoundError(absl::StrCat(
        where, ": no device with UUID ", absl::BytesToHexString(ref.device_uuid),
        " is visible to hostkvd (check the GPUs given to its container and "
        "CUDA_VISIBLE_DEVICES)"));
  }
  if (ref.device < 0 || static_cast<size_t>(ref.device) >= devices_.size()) {
    return absl::NotFoundError(absl::StrCat(where, ": device ", ref.device,
                                            " does not exist (hostkvd sees ",
                                            devices_.size(), ")"));
  }
  return ref.device;
}

absl::StatusOr<std::unique_ptr<DeviceImport>> CudaBackend::OpenImport(
    std::shared_ptr<HostPool> pool, const GpuImportSpec& spec) {
  const PoolGeometry& g = pool->geometry();
  RETURN_IF_ERROR(
      CheckImportShape(g, spec.token_slots, spec.k.size(), spec.v.size()));
  // CheckImportShape bounds the product by 2^50: no overflow.
  const uint64_t need = spec.token_slots * g.token_stride();
  std::optional<int> device;
  std::vector<IpcMappingRef> mappings;
  // Opens one buffer; returns its address in the daemon.
  auto open = [&](const GpuBufferRef& ref, const std::string& where,
                  uint64_t min_size) -> absl::StatusOr<uint8_t*> {
    ASSIGN_OR_RETURN(int d, ResolveDevice(ref, where));
    if (device.has_value() && *device != d) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": on device ", d, " but the other buffers are on device ",
          *device, "; one registration covers one device"));
    }
    device = d;
    if (ref.size < min_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": size ", ref.size, " is smaller than the ", min_size,
          " bytes needed"));
    }
    absl::StatusOr<IpcMappingRef> mapping = mappings_.Open(ref.ipc_handle, d);
    if (!mapping.ok()) {
      return absl::Status(mapping.status().code(),
                          absl::StrCat(where, ": ", mapping.status().message()));
    }
    if (ref.offset > mapping->size() || ref.size > mapping->size() - ref.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": offset ", ref.offset, " + size ", ref.size,
          " exceeds the allocation of ", mapping->size(), " bytes"));
    }
    uint8_t* address = mapping->base() + ref.offset;
    mappings.push_back(std::move(*mapping));
    return address;
  };
  std::vector<LayerBuffers> layers(g.num_layers, LayerBuffers{{nullptr, nullptr}});
  const std::vector<GpuBufferRef>* planes[2] = {&spec.k, &spec.v};
  for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      ASSIGN_OR_RETURN(
          layers[l].plane[kv],
          open((*planes[kv])[l],
               absl::StrCat(kv == 0 ? "k_buffers[" : "v_buffers[", l, "]"),
               need));
    }
  }
  uint64_t* words = nullptr;
  if (spec.signals.has_value()) {
    if (spec.signals->offset % sizeof(uint64_t) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gpu_signals: offset ", spec.signals->offset,
          " is not 8-byte aligned"));
    }
    ASSIGN_OR_RETURN(uint8_t* address,
                     open(*spec.signals, "gpu_signals",
                          uint64_t{g.num_layers} * sizeof(uint64_t)));
    if (!devices_[*device].stream_mem_ops64) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gpu_signals: device ", *device, " does not support 64-bit stream "
          "memory operations (cuStreamWaitValue64); register without "
          "gpu_signals and wait on the host"));
    }
    words = reinterpret_cast<uint64_t*>(address);
  }
  // The claim is released exactly once, whoever gets there first: a second
  // release could erase the claim another import made on the same words.
  auto release = std::make_shared<CloseOnce>();
  if (words != nullptr) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(words);
    RETURN_IF_ERROR(ClaimSignalWords(
        begin, begin + uint64_t{g.num_layers} * sizeof(uint64_t)));
    *release = CloseOnce([this, begin] { ReleaseSignalWords(begin); });
  }
  absl::StatusOr<std::unique_ptr<CudaImportState>> state =
      CudaImportState::Create(*device, std::move(mappings), words, g.num_layers,
                              [release] { release->Run(); });
  if (!state.ok()) {
    release->Run();
    return state.status();
  }
  return DeviceImport::ForGpu(std::move(pool), spec.token_slots,
                              std::move(layers), std::move(*state));
}

absl::Status CudaBackend::ClaimSignalWords(uintptr_t begin, uintptr_t end) {
  absl::MutexLock lock(&claims_mu_);
  auto next = claims_.lower_bound(begin);
  const bool overlaps_next = next != claims_.end() && next->first < end;
  const bool overlaps_prev =
      next != claims_.begin() && std::prev(next)->second > begin;
  if (overlaps_next || overlaps_prev) {
    return absl::FailedPreconditionError(
        "gpu_signals: these words are in use by another import; give each "
        "registration its own GpuSignals");
  }
  claims_.emplace(begin, end);
  return absl::OkStatus();
}

void CudaBackend::ReleaseSignalWords(uintptr_t begin) {
  absl::MutexLock lock(&claims_mu_);
  claims_.erase(begin);
}

void CudaBackend::OrderAfterLastOp(OwnerTag owner, cudaStream_t stream) {
  absl::MutexLock lock(&mu_);
  auto it = last_op_.find(owner);
  if (it == last_op_.end() || it->second.stream == stream) return;
  const absl::Status s = CudaStatus(
      cudaStreamWaitEvent(stream, it->second.event, 0), "cudaStreamWaitEvent");
  if (!s.ok()) spdlog::warn("ordering after the session's last op: {}", std::string(s.message()));
}

void CudaBackend::RecordLastOp(OwnerTag owner, cudaStream_t stream, int device) {
  cudaEvent_t event = nullptr;
  absl::Status s = CudaStatus(
      cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  if (s.ok()) s = CudaStatus(cudaEventRecord(event, stream), "cudaEventRecord");
  if (!s.ok()) {
    spdlog::warn("recording the session's last op: {}", std::string(s.message()));
    if (event != nullptr) cudaEventDestroy(event);
    return;
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = last_op_.try_emplace(owner, LastOp{stream, event, device});
  if (!inserted) {
    cudaEventDestroy(it->second.event);  // released once it completes
    it->second = LastOp{stream, event, device};
  }
}

absl::Status CudaBackend::CheckCanCopy(const TransferOp& op,
                                       const CudaImportState& gpu) {
  {
    absl::MutexLock lock(&mu_);
    if (!fatal_.empty()) {
      return absl::UnavailableError(absl::StrCat(
          "the CUDA context failed (", fatal_, "): restart hostkvd"));
    }
  }
  if (op.signals->cancelled()) {
    return absl::CancelledError("the session ended before the copy started");
  }
  if (op.wait_kv_written != 0 && gpu.released()) {
    return absl::CancelledError(
        "the import was released: its KV-written mark will not come");
  }
  return absl::OkStatus();
}

void CudaBackend::PublishAfterLayer(const TransferOp& op, cudaStream_t stream,
                                    uint32_t layer) {
  if (layer + 1 >= op.layer_end) return;  // the last: Finish publishes it
  if (!op.host_layer_progress) return;    // the engine waits on the GPU only
  auto* token = new LayerToken{op.signals.get(), op.signal_index,
                               layer + 1 - op.layer_begin};
  const cudaError_t error =
      cudaLaunchHostFunc(stream, &CudaBackend::OnLayerReached, token);
  if (error != cudaSuccess) {
    // Not fatal: host waiters then see this layer with the next one.
    delete token;
    cudaGetLastError();
    spdlog::warn("op {}: per-layer host callback: {}", op.op_id,
                 cudaGetErrorString(error));
  }
}

absl::Status CudaBackend::Enqueue(std::unique_ptr<TransferOp> op) {
  // Held for the whole call: once the operation is in tracker_, the
  // completion thread or the watchdog may finish it and drop op->import
  // (closing its stream) while this function still uses the stream.
  const std::shared_ptr<DeviceImport> import = op->import;
  auto* gpu = static_cast<CudaImportState*>(import->gpu());
  const cudaStream_t stream = gpu->stream();
  const OwnerTag owner = op->owner;
  tracker_.Begin(owner);
  auto entry = std::make_unique<GpuOpTracker::Entry>();
  entry->op = std::move(op);
  entry->enqueued = absl::Now();
  const TransferOp& o = *entry->op;
  if (o.wait_kv_written != 0) {
    entry->wait_deadline = entry->enqueued + options_.wait_timeout;
  }
  ScopedDevice on_device(gpu->device());
  // Without its device nothing can be enqueued, not even the signals.
  absl::Status status = on_device.status();
  if (status.ok()) status = CheckCanCopy(o, *gpu);
  bool copy = status.ok();
  const bool kernel = o.task.mechanism == CopyMechanism::kKernel;
  PinnedBlock token_index;
  if (copy && kernel) {
    absl::StatusOr<PinnedBlock> block =
        staging_.Acquire(2 * o.task.total_tokens * sizeof(uint64_t));
    if (block.ok()) {
      token_index = *block;
      entry->release = [this, token_index] { staging_.Release(token_index); };
      status = FillTokenIndex(o.task, token_index);
    } else {
      status = block.status();
    }
    copy = status.ok();
  }
  if (on_device.status().ok()) {
    OrderAfterLastOp(owner, stream);
    if (copy) {
      const PoolPinning* pinning = o.import->pool()->pinning();
      CudaTransferOptions transfer;
      transfer.kernel_blocks = options_.kernel_blocks;
      transfer.pin_chunk_bytes = pinning != nullptr ? pinning->chunk_bytes() : 0;
      transfer.prefer_overlap = options_.dma_prefer_overlap;
      transfer.dma_through_device_base =
          !devices_[gpu->device()].host_pointer_for_registered_mem;
      transfer.after_layer = [&](uint32_t layer) {
        PublishAfterLayer(o, stream, layer);
      };
      status = EnqueueTransfer(
          o, *gpu, pinning != nullptr ? pinning->device_base() : nullptr,
          kernel ? &token_index : nullptr, transfer);
    } else {
      // No copy, but the layers are still signalled: an engine stream may
      // already wait for them.
      const absl::Status signalled = SignalLayers(o, *gpu);
      if (!signalled.ok()) {
        spdlog::error("op {}: {}", o.op_id, std::string(signalled.message()));
      }
    }
    RecordLastOp(owner, stream, gpu->device());
  }
  entry->failed = !status.ok();
  const uint64_t op_id = o.op_id;
  const uint64_t id = tracker_.Add(std::move(entry));
  // The callback's token; it frees it. (If the context fails, no callback
  // comes and the watchdog finishes the operation; the token then leaks.)
  auto* token = new CallbackToken{this, id};
  const cudaError_t error =
      on_device.status().ok()
          ? cudaLaunchHostFunc(stream, &CudaBackend::OnStreamReached, token)
          : cudaErrorInvalidDevice;
  if (error != cudaSuccess) {
    // No callback will come: wait for the stream here and finish now.
    delete token;
    cudaGetLastError();
    if (on_device.status().ok()) cudaStreamSynchronize(stream);
    if (std::unique_ptr<GpuOpTracker::Entry> done = tracker_.Take(id)) {
      done->failed = true;
      Finish(std::move(done));
    }
    spdlog::warn("op {}: cudaLaunchHostFunc: {}", op_id,
                 cudaGetErrorString(error));
    if (status.ok()) status = CudaStatus(error, "cudaLaunchHostFunc");
  }
  return absl::IsCancelled(status) ? absl::OkStatus() : status;
}

void CudaBackend::OnStreamReached(void* data) {
  // On CUDA's callback thread: no CUDA calls here, hand over and return.
  std::unique_ptr<CallbackToken> token(static_cast<CallbackToken*>(data));
  CudaBackend* self = token->backend;
  absl::MutexLock lock(&self->done_mu_);
  self->done_.push_back(token->id);
}

void CudaBackend::OnLayerReached(void* data) {
  // On CUDA's callback thread: a store and a futex wake, no CUDA call.
  std::unique_ptr<LayerToken> token(static_cast<LayerToken*>(data));
  token->board->Publish(token->index, token->layers_done);
}

void CudaBackend::CompletionLoop() {
  while (true) {
    uint64_t id = 0;
    {
      absl::MutexLock lock(&done_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu_) {
        return !done_.empty() || stopping_;
      };
      done_mu_.Await(absl::Condition(&ready));
      if (done_.empty()) return;
      id = done_.front();
      done_.pop_front();
    }
    if (std::unique_ptr<GpuOpTracker::Entry> done = tracker_.Take(id)) {
      Finish(std::move(done));
    }
  }
}

std::string CudaBackend::Inspect(const GpuOpTracker::Watched& watched) {
  // `watched.import` keeps the stream alive while it is queried, even if
  // the completion thread finishes the operation meanwhile.
  auto* gpu = static_cast<CudaImportState*>(watched.import->gpu());
  if (watched.wait_overdue) {
    if (!gpu->released()) {
      spdlog::error("GPU op {}: the engine's mark {} did not come within {}: "
                    "releasing the import's mark waits; the operation (and "
                    "every later one waiting on this import) is reported "
                    "failed",
                    watched.op_id, watched.wait_value,
                    absl::FormatDuration(options_.wait_timeout));
    }
    // Again at every look while the operation is still there: a mark the
    // live engine's stream writes into the page after the release could
    // overwrite 2^63 - 1 before the blocked wait polled it. A CPU store,
    // so repeating it costs nothing; later mark waits on a released
    // import are failed before they are enqueued.
    gpu->ReleaseWaits();
  }
  ScopedDevice on_device(gpu->device());
  const cudaError_t error = cudaStreamQuery(gpu->stream());
  // Not ready (still copying, or waiting for "KV written") is normal.
  if (error == cudaSuccess || error == cudaErrorNotReady) return "";
  return absl::StrCat(cudaGetErrorName(error), ": ", cudaGetErrorString(error));
}

void CudaBackend::WatchdogLoop() {
  constexpr absl::Duration kPeriod = absl::Seconds(1);
  while (true) {
    {
      absl::MutexLock lock(&done_mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu_) {
        return stopping_;
      };
      if (done_mu_.AwaitWithTimeout(absl::Condition(&stop), kPeriod)) return;
    }
    {
      absl::MutexLock lock(&mu_);
      if (!fatal_.empty()) continue;
    }
    std::string fatal;
    for (const GpuOpTracker::Watched& watched : tracker_.Watch(absl::Now())) {
      fatal = Inspect(watched);
      if (!fatal.empty()) break;
    }
    if (fatal.empty()) continue;
    {
      absl::MutexLock lock(&mu_);
      fatal_ = fatal;
    }
    std::vector<std::unique_ptr<GpuOpTracker::Entry>> orphans =
        tracker_.TakeAll();
    spdlog::critical("the CUDA context failed ({}): {} operations in flight "
                     "are reported failed, the GPU backend refuses new ones; "
                     "restart hostkvd",
                     fatal, orphans.size());
    for (std::unique_ptr<GpuOpTracker::Entry>& op : orphans) {
      op->failed = true;
      Finish(std::move(op));
    }
    if (options_.on_fatal) options_.on_fatal(fatal);
  }
}

void CudaBackend::Finish(std::unique_ptr<GpuOpTracker::Entry> done) {
  std::unique_ptr<TransferOp> op = std::move(done->op);
  const OwnerTag owner = op->owner;
  const CopyDirection direction = op->task.direction;
  if (done->release) done->release();
  // A transfer that was let through by ReleaseWaits copied KV the engine may
  // not have written (or into slots it may still read): never report it as
  // a good copy.
  if (op->wait_kv_written != 0 &&
      static_cast<CudaImportState*>(op->import->gpu())->released()) {
    done->failed = true;
  }
  if (!done->failed) {
    HostPool& pool = *op->import->pool();
    (direction == CopyDirection::kHostToDevice ? pool.completed_loads()
                                               : pool.completed_backups())
        .fetch_add(1);
    if (options_.metrics != nullptr) {
      const absl::Time now = absl::Now();
      options_.metrics->RecordLayerReady(direction, now - op->submitted);
      options_.metrics->RecordTransfer(direction, op->task.mechanism, op->bytes,
                                       now - done->enqueued);
    }
    // Unpinned before the last layer is reported, as on the CPU path.
    op->host_pages.Release();
    op->signals->Publish(op->signal_index, op->layer_end - op->layer_begin);
  } else {
    spdlog::warn("GPU op {} failed", op->op_id);
  }
  // Drops the import (which may close its stream and mappings) before the
  // record says the operation ended.
  FinishOp(std::move(op), done->failed);
  tracker_.End(owner, [this, owner] {
    absl::MutexLock lock(&mu_);
    auto it = last_op_.find(owner);
    if (it != last_op_.end()) {
      cudaEventDestroy(it->second.event);
      last_op_.erase(it);
    }
  });
}

void CudaBackend::AwaitIdle(std::optional<OwnerTag> owner) {
  // Bounded in practice: mark waits are released after wait_timeout, and a
  // failed context finishes everything; this only logs if it lasts.
  while (!tracker_.AwaitIdle(owner, options_.wait_timeout + absl::Seconds(5))) {
    spdlog::warn("still waiting for {} GPU operations to finish",
                 tracker_.size());
  }
}

}  // namespace hostkv
