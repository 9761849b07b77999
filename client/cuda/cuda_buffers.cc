#include "hostkv/cuda_buffers.h"

#include <cuda.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/driver_api.h"
#include "proto/contract/shm_segment.h"
#include "proto/contract/status_macros.h"

namespace hostkv {

absl::StatusOr<v1::DeviceBuffer> ExportCudaBuffer(const void* ptr,
                                                  uint64_t size) {
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  cudaPointerAttributes attributes{};
  RETURN_IF_ERROR(CudaStatus(cudaPointerGetAttributes(&attributes, ptr),
                             "cudaPointerGetAttributes"));
  if (attributes.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError(
        "ExportCudaBuffer: the pointer is not device memory (cudaMalloc)");
  }
  ScopedDevice on_device(attributes.device);
  RETURN_IF_ERROR(on_device.status());
  int ipc_capable = 0;
  const CUresult r = api->pointer_get_attribute(
      &ipc_capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
      reinterpret_cast<CUdeviceptr>(ptr));
  if (r == CUDA_SUCCESS && ipc_capable == 0) {
    return absl::FailedPreconditionError(
        "ExportCudaBuffer: this memory cannot be exported with "
        "cudaIpcGetMemHandle: it comes from the CUDA virtual memory API "
        "(e.g. PyTorch with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; "
        "allocate the KV cache with expandable_segments:False)");
  }
  ASSIGN_OR_RETURN(AllocationRange range, GetAllocationRange(ptr));
  const uint64_t offset = reinterpret_cast<uintptr_t>(ptr) - range.base;
  if (offset > range.size || size > range.size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ExportCudaBuffer: ", size, " bytes at offset ", offset,
        " leave their allocation of ", range.size, " bytes"));
  }
  cudaIpcMemHandle_t handle;
  const absl::Status exported = CudaStatus(
      cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(range.base)),
      "cudaIpcGetMemHandle");
  if (!exported.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ExportCudaBuffer: ", exported.message(),
        " (memory from the virtual memory API or cudaMallocAsync pools "
        "cannot be exported this way)"));
  }
  cudaDeviceProp prop{};
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, attributes.device),
                             "cudaGetDeviceProperties"));
  v1::DeviceBuffer buffer;
  buffer.set_cuda_ipc_handle(
      std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
  buffer.set_offset(offset);
  buffer.set_size(size);
  buffer.set_device(attributes.device);
  buffer.set_device_uuid(std::string(prop.uuid.bytes, sizeof(prop.uuid.bytes)));
  return buffer;
}

// The daemon's "KV written" page in this process: the memfd, its mapping
// and its CUDA registration (released in that order, reversed).
struct GpuSignals::KvWordMapping {
  static constexpr size_t kBytes = 4096;
  ScopedFd fd;
  void* page = MAP_FAILED;
  HostRegistration registration;

  ~KvWordMapping() {
    registration = HostRegistration();
    if (page != MAP_FAILED) munmap(page, kBytes);
  }
  uint64_t* word() const { return static_cast<uint64_t*>(page); }
};

GpuSignals::GpuSignals(uint32_t num_layers, int device, uint64_t* words)
    : num_layers_(num_layers), device_(device), words_(words) {}

absl::StatusOr<std::unique_ptr<GpuSignals>> GpuSignals::Create(
    uint32_t num_layers, int device) {
  ScopedDevice on_device(device);
  RETURN_IF_ERROR(on_device.status());
  if (!Supports64BitStreamMemOps(device)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", device, " has no 64-bit stream memory operations "
        "(cuStreamWaitValue64); wait on the host instead (Client::WaitLayer)"));
  }
  // Layer words only ("KV written" is the daemon's page); at least one
  // word, so that there is an allocation to export. The allocation is a
  // whole 2 MiB of its own (kCudaIpcGranularity): no sibling shares it.
  const size_t bytes =
      std::max<size_t>(num_layers, 1) * sizeof(uint64_t);
  void* words = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&words, RoundUpToIpcGranularity(bytes)),
                             "cudaMalloc"));
  std::unique_ptr<GpuSignals> signals(
      new GpuSignals(num_layers, device, static_cast<uint64_t*>(words)));
  RETURN_IF_ERROR(CudaStatus(cudaMemset(words, 0, bytes), "cudaMemset"));
  RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  ASSIGN_OR_RETURN(signals->buffer_, ExportCudaBuffer(words, bytes));
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&signals->release_stream_,
                                cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags"));
  return signals;
}

GpuSignals::~GpuSignals() {
  ScopedDevice on_device(device_);
  // A MarkKvWritten still queued (behind a wait) writes into the page: let
  // the device finish before the page is unregistered and unmapped.
  if (kv_word_ != nullptr) cudaDeviceSynchronize();
  kv_word_.reset();
  if (release_stream_ != nullptr) cudaStreamDestroy(release_stream_);
  cudaFree(words_);
}

absl::Status GpuSignals::ReleaseAll(cudaStream_t stream) {
  // The largest value CU_STREAM_WAIT_VALUE_GEQ (a wrapping comparison) sees
  // as >= every signal value the daemon hands out (< 2^63).
  constexpr uint64_t kReleased = (1ull << 63) - 1;
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  ScopedDevice on_device(device_);
  RETURN_IF_ERROR(on_device.status());
  if (stream == nullptr) stream = release_stream_;
  if (kv_word_ != nullptr) {
    std::atomic_ref<uint64_t>(*kv_word_->word())
        .store(kReleased, std::memory_order_release);
  }
  for (uint32_t i = 0; i < num_layers_; ++i) {
    RETURN_IF_ERROR(DriverStatus(
        api->stream_write_value64(reinterpret_cast<CUstream>(stream),
                                  reinterpret_cast<CUdeviceptr>(words_ + i),
                                  kReleased, CU_STREAM_WRITE_VALUE_DEFAULT),
        "releasing GPU signal words"));
  }
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

absl::Status GpuSignals::WaitLayer(const Operation& op, uint32_t layer,
                                   cudaStream_t stream) const {
  if (layer < op.layer_begin || layer - op.layer_begin >= op.num_layers ||
      layer >= num_layers_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "operation ", op.op_id, " covers layers [", op.layer_begin, ", ",
        op.layer_begin + op.num_layers, "), not layer ", layer));
  }
  if (op.signal_value == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "operation ", op.op_id, " has no GPU signal (its import was "
        "registered without gpu_signals)"));
  }
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  return DriverStatus(
      api->stream_wait_value64(reinterpret_cast<CUstream>(stream),
                               reinterpret_cast<CUdeviceptr>(words_ + layer),
                               op.signal_value, CU_STREAM_WAIT_VALUE_GEQ),
      "cuStreamWaitValue64");
}

absl::Status GpuSignals::AttachKvWord(Client& client, uint64_t import_id) {
  ASSIGN_OR_RETURN(const int fd, client.FetchKvWord(import_id));
  auto mapping = std::make_unique<KvWordMapping>();
  mapping->fd = ScopedFd(fd);
  struct stat st{};
  if (fstat(fd, &st) != 0 ||
      static_cast<uint64_t>(st.st_size) < KvWordMapping::kBytes) {
    return absl::InternalError(
        "AttachKvWord: the daemon's page is not one 4 KiB page");
  }
  mapping->page = mmap(nullptr, KvWordMapping::kBytes, PROT_READ | PROT_WRITE,
                       MAP_SHARED, fd, 0);
  if (mapping->page == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("AttachKvWord: mmap: ", std::strerror(errno)));
  }
  ScopedDevice on_device(device_);
  RETURN_IF_ERROR(on_device.status());
  ASSIGN_OR_RETURN(
      mapping->registration,
      HostRegistration::Create(mapping->page, KvWordMapping::kBytes));
  // The previous page may still have marks queued: drain them first.
  if (kv_word_ != nullptr) cudaDeviceSynchronize();
  kv_word_ = std::move(mapping);
  kv_written_ = 0;  // a fresh page starts at nothing written
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> GpuSignals::MarkKvWritten(cudaStream_t stream) {
  if (kv_word_ == nullptr) {
    return absl::FailedPreconditionError(
        "MarkKvWritten: fetch the daemon's KV-written page first "
        "(GpuSignals::AttachKvWord after RegisterDeviceBuffers)");
  }
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  const uint64_t value = kv_written_ + 1;
  RETURN_IF_ERROR(DriverStatus(
      api->stream_write_value64(
          reinterpret_cast<CUstream>(stream),
          reinterpret_cast<CUdeviceptr>(
              kv_word_->registration.device_address()),
          value,
          CU_STREAM_WRITE_VALUE_DEFAULT),
      "cuStreamWriteValue64"));
  kv_written_ = value;
  return value;
}

absl::StatusOr<uint64_t> GpuSignals::ReadWord(uint32_t index) const {
  if (index > num_layers_) {
    return absl::InvalidArgumentError(absl::StrCat("no word ", index));
  }
  if (index == num_layers_) {
    if (kv_word_ == nullptr) return 0;
    return std::atomic_ref<uint64_t>(*kv_word_->word())
        .load(std::memory_order_acquire);
  }
  ScopedDevice on_device(device_);
  uint64_t value = 0;
  RETURN_IF_ERROR(CudaStatus(cudaMemcpy(&value, words_ + index, sizeof(value),
                                        cudaMemcpyDeviceToHost),
                             "cudaMemcpy"));
  return value;
}

}  // namespace hostkv
