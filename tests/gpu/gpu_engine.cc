#include "tests/gpu/gpu_engine.h"

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "hostkv/cuda_buffers.h"
#include "kernels/cuda/driver_api.h"
#include "proto/contract/status_macros.h"

namespace hostkv::gpu_testing {
namespace {

constexpr uint64_t kGap = 4096;  // bytes before, between and after buffers

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// Whether process `pid` has exited (a zombie counts: DaemonProcess reaps it).
bool Exited(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');  // the name may hold spaces
  return paren == std::string::npos || paren + 2 >= line.size() ||
         line[paren + 2] == 'Z' || line[paren + 2] == 'X';
}

}  // namespace

v1::PoolSpec Bf16PoolSpec(const std::string& name, bool mla, uint32_t layers,
                          uint32_t heads, uint32_t dim, v1::Layout layout,
                          uint32_t page_size, uint64_t capacity_tokens) {
  v1::PoolSpec spec;
  spec.set_name(name);
  spec.set_layout(layout);
  spec.set_page_size(page_size);
  spec.set_capacity_tokens(capacity_tokens);
  v1::Geometry* g = spec.mutable_geometry();
  g->set_dtype(v1::DTYPE_BF16);
  if (mla) {
    g->mutable_mla()->set_num_layers(layers);
    g->mutable_mla()->set_kv_lora_rank(dim - 64);
    g->mutable_mla()->set_qk_rope_head_dim(64);
  } else {
    g->mutable_mha()->set_num_layers(layers);
    g->mutable_mha()->set_num_kv_heads(heads);
    g->mutable_mha()->set_head_dim(dim);
  }
  return spec;
}

bool CudaDevicePresent(std::string* why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    *why = absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(error), " (",
                        cudaGetErrorString(error), ")");
    return false;
  }
  if (count == 0) {
    *why = "cudaGetDeviceCount reports no device";
    return false;
  }
  return true;
}

absl::StatusOr<DeviceMemory> DeviceMemory::Allocate(uint64_t bytes) {
  // Whole 2 MiB units: a buffer shared over CUDA IPC is never a sibling in
  // a block of the driver's (see kCudaIpcGranularity).
  const uint64_t allocated = RoundUpToIpcGranularity(bytes);
  void* p = nullptr;
  RETURN_IF_ERROR(CudaStatus(
      cudaMalloc(&p, allocated),
      absl::StrCat("cudaMalloc of ", bytes, " bytes (", allocated, ")")));
  DeviceMemory memory;
  memory.data_ = static_cast<uint8_t*>(p);
  memory.size_ = bytes;
  return memory;
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceMemory::~DeviceMemory() {
  if (data_ != nullptr) cudaFree(data_);
}

absl::StatusOr<CudaStream> CudaStream::Create() {
  CudaStream stream;
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&stream.stream_, cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags"));
  return stream;
}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status AwaitStream(cudaStream_t stream, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const cudaError_t state = cudaStreamQuery(stream);
    if (state == cudaSuccess) return absl::OkStatus();
    if (state != cudaErrorNotReady) return CudaStatus(state, "cudaStreamQuery");
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the stream is still busy after ", absl::FormatDuration(timeout)));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

absl::Status AwaitPinned(Client& client, const std::string& pool,
                         absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    ASSIGN_OR_RETURN(v1::GetPoolStatsResponse stats, client.GetPoolStats(pool));
    if (stats.pools_size() != 1) {
      return absl::InternalError(absl::StrCat("GetPoolStats('", pool,
                                              "') returned ",
                                              stats.pools_size(), " pools"));
    }
    const v1::PoolStats& p = stats.pools(0);
    switch (p.pin_state()) {
      case v1::PIN_PINNED:
        return absl::OkStatus();
      case v1::PIN_FAILED:
        return absl::FailedPreconditionError(
            absl::StrCat("pool '", pool, "' failed to pin: ", p.pin_error()));
      case v1::PIN_PINNING:
        break;
      default:
        return absl::FailedPreconditionError(
            absl::StrCat("pool '", pool, "' has pin_state ",
                         v1::PinState_Name(p.pin_state()), " (backend ",
                         v1::Backend_Name(p.backend()),
                         "): is hostkvd running its CUDA backend?"));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "pool '", pool, "' not pinned after ", absl::FormatDuration(timeout),
          " (", p.pinned_bytes(), " of ", p.capacity_bytes(), " bytes)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> StartCudaDaemon(
    const std::vector<std::string>& extra_args, absl::Duration timeout) {
  std::vector<std::string> args = {"--cuda=on"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  const absl::Time deadline = absl::Now() + timeout;
  auto daemon = std::make_unique<testing::DaemonProcess>(args);
  while (!daemon->started()) {
    if (daemon->pid() <= 0 || Exited(daemon->pid())) {
      return absl::UnavailableError(
          absl::StrCat("hostkvd exited during start-up:\n", daemon->log()));
    }
    if (daemon->log().find("listening on") != std::string::npos) {
      absl::StatusOr<bool> serving = CheckHealth(daemon->target());
      if (serving.ok() && *serving) break;
    }
    if (absl::Now() > deadline) {
      return absl::UnavailableError(absl::StrCat("hostkvd did not start in ",
                                                 absl::FormatDuration(timeout),
                                                 ":\n", daemon->log()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return daemon;
}

absl::StatusOr<std::unique_ptr<EngineKvCache>> EngineKvCache::Create(
    const KvCacheShape& shape) {
  std::unique_ptr<EngineKvCache> cache(new EngineKvCache(shape));
  const uint64_t bytes = cache->buffer_bytes();
  const uint32_t own = std::min(shape.shared_from, shape.layers);
  cache->places_.resize(uint64_t{shape.layers} * shape.planes);
  for (uint32_t l = 0; l < own; ++l) {
    for (uint32_t kv = 0; kv < shape.planes; ++kv) {
      ASSIGN_OR_RETURN(DeviceMemory memory, DeviceMemory::Allocate(bytes));
      cache->places_[l * shape.planes + kv] = {cache->allocations_.size(), 0};
      cache->allocations_.push_back(std::move(memory));
    }
  }
  if (own < shape.layers) {
    const uint64_t slot = RoundUp(bytes + shape.misalign, kGap) + kGap;
    const uint64_t shared = uint64_t{shape.layers - own} * shape.planes;
    ASSIGN_OR_RETURN(DeviceMemory memory,
                     DeviceMemory::Allocate(kGap + shared * slot));
    for (uint64_t j = 0; j < shared; ++j) {
      cache->places_[own * shape.planes + j] = {
          cache->allocations_.size(),
          kGap + j * slot + (j % 2 == 1 ? shape.misalign : 0)};
    }
    cache->allocations_.push_back(std::move(memory));
  }
  for (uint32_t l = 0; l < shape.layers; ++l) {
    for (uint32_t kv = 0; kv < shape.planes; ++kv) {
      ASSIGN_OR_RETURN(v1::DeviceBuffer exported,
                       ExportCudaBuffer(cache->buffer(kv, l), bytes));
      (kv == 0 ? cache->k_ : cache->v_).push_back(std::move(exported));
    }
  }
  return cache;
}

uint8_t* EngineKvCache::buffer(uint32_t kv, uint32_t layer) const {
  const Place& p = places_[layer * shape_.planes + kv];
  return allocations_[p.allocation].data() + p.offset;
}

absl::Status EngineKvCache::Fill(uint8_t byte) const {
  for (const DeviceMemory& memory : allocations_) {
    RETURN_IF_ERROR(CudaStatus(cudaMemset(memory.data(), byte, memory.size()),
                               "cudaMemset"));
  }
  return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

absl::Status EngineKvCache::Write(uint32_t kv, uint32_t layer,
                                  const std::vector<uint8_t>& bytes) const {
  if (bytes.size() != buffer_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Write: ", bytes.size(), " bytes for a buffer of ", buffer_bytes()));
  }
  // From pageable memory cudaMemcpy may return before the DMA is done.
  RETURN_IF_ERROR(CudaStatus(cudaMemcpy(buffer(kv, layer), bytes.data(),
                                        bytes.size(), cudaMemcpyHostToDevice),
                             "cudaMemcpy to the KV cache"));
  return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

absl::StatusOr<std::vector<uint8_t>> EngineKvCache::ReadAllocation(
    size_t index) const {
  const DeviceMemory& memory = allocations_[index];
  std::vector<uint8_t> bytes(memory.size());
  RETURN_IF_ERROR(CudaStatus(cudaMemcpy(bytes.data(), memory.data(),
                                        memory.size(), cudaMemcpyDeviceToHost),
                             "cudaMemcpy from the KV cache"));
  return bytes;
}

}  // namespace hostkv::gpu_testing
