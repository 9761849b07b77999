#include "server/cuda/cuda_import.h"

#include <cuda.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "kernels/cuda/driver_api.h"
#include "proto/contract/status_macros.h"
#include "spdlog/spdlog.h"

namespace hostkv {

absl::StatusOr<std::unique_ptr<CudaImportState>> CudaImportState::Create(
    int device, std::vector<IpcMappingRef> mappings, uint64_t* signal_words,
    uint32_t num_layers, std::function<void()> on_close) {
  ScopedDevice on_device(device);
  RETURN_IF_ERROR(on_device.status());
  std::unique_ptr<CudaImportState> state(new CudaImportState(
      device, std::move(mappings), signal_words, num_layers));
  if (signal_words != nullptr) {
    // Words reused from an earlier registration keep their values: start
    // above them, or a wait would pass before this import's copies.
    std::vector<uint64_t> words(num_layers + 1);
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(words.data(), signal_words,
                   words.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost),
        "reading gpu_signals"));
    uint64_t last = 0;
    for (uint32_t l = 0; l < num_layers; ++l) last = std::max(last, words[l]);
    if (last >= kReleasedKvWritten) {
      return absl::InvalidArgumentError(
          "gpu_signals: the words hold values near 2^63; zero them first");
    }
    // A "KV written" word an earlier import released would let every
    // backup pass its wait at once: back to nothing written.
    if (words[num_layers] == kReleasedKvWritten) {
      const uint64_t zero = 0;
      RETURN_IF_ERROR(CudaStatus(
          cudaMemcpy(signal_words + num_layers, &zero, sizeof(zero),
                     cudaMemcpyHostToDevice),
          "resetting gpu_signals"));
    }
    state->last_signal_value_.store(last);
  }
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&state->stream_, cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags"));
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&state->side_stream_, cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags"));
  // Installed last: a failed Create leaves `on_close` to the caller, so it
  // runs once (the destructor of a half-made state must not run it too).
  state->on_close_ = std::move(on_close);
  return state;
}

CudaImportState::~CudaImportState() {
  ScopedDevice on_device(device_);
  for (cudaStream_t* stream : {&stream_, &side_stream_}) {
    if (*stream == nullptr) continue;
    const absl::Status s = CudaStatus(cudaStreamSynchronize(*stream),
                                      "cudaStreamSynchronize");
    if (!s.ok()) spdlog::warn("closing a CUDA import: {}", std::string(s.message()));
    cudaStreamDestroy(*stream);
  }
  if (on_close_) on_close_();
  // mappings_ close after the streams are idle (member destruction).
}

void CudaImportState::ReleaseWaits() {
  released_.store(true);
  if (signal_words_ == nullptr) return;
  absl::StatusOr<const DriverApi*> api = GetDriverApi();
  if (!api.ok()) return;
  ScopedDevice on_device(device_);
  const CUresult r = (*api)->stream_write_value64(
      reinterpret_cast<CUstream>(side_stream_),
      reinterpret_cast<CUdeviceptr>(signal_words_ + num_layers_),
      kReleasedKvWritten, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != CUDA_SUCCESS) {
    spdlog::warn("{}", DriverStatus(r, "releasing KV-written waits").ToString());
  }
}

}  // namespace hostkv
