#include "server/cuda/cuda_import.h"

#include <algorithm>
#include <limits>
#include <utility>

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
    std::vector<uint64_t> words(num_layers);
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(words.data(), signal_words,
                   words.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost),
        "reading gpu_signals"));
    uint64_t last = 0;
    for (uint64_t word : words) last = std::max(last, word);
    if (last >= kReleasedKvWritten) {
      return absl::InvalidArgumentError(
          "gpu_signals: the words hold values near 2^63; zero them first");
    }
    state->signal_values_.Start(last);
    // "KV written" is new with every import (zero: nothing written), in a
    // page the daemon owns: releasing it is a CPU store, never a stream
    // operation that could queue behind the wait it releases.
    ASSIGN_OR_RETURN(state->kv_word_, KvWordPage::Create());
    ASSIGN_OR_RETURN(state->kv_word_registration_,
                     HostRegistration::Create(state->kv_word_->page(),
                                              KvWordPage::kPageBytes));
  }
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&state->stream_, cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags"));
  // Installed last: a failed Create leaves `on_close` to the caller, so it
  // runs once (the destructor of a half-made state must not run it too).
  state->on_close_ = std::move(on_close);
  return state;
}

CudaImportState::~CudaImportState() {
  ScopedDevice on_device(device_);
  if (stream_ != nullptr) {
    const absl::Status s = CudaStatus(cudaStreamSynchronize(stream_),
                                      "cudaStreamSynchronize");
    if (!s.ok()) spdlog::warn("closing a CUDA import: {}", std::string(s.message()));
    cudaStreamDestroy(stream_);
  }
  // The stream is idle: the KV-written page may go (unregistered first).
  kv_word_registration_ = HostRegistration();
  kv_word_.reset();
  if (on_close_) on_close_();
  // mappings_ close after the streams are idle (member destruction).
}

void CudaImportState::ReleaseWaits() {
  released_.store(true);
  // A plain CPU store into host memory: the stream's cuStreamWaitValue64
  // sees it on its next poll, whatever queue the stream shares.
  if (kv_word_ != nullptr) kv_word_->Release();
}

absl::StatusOr<ScopedFd> CudaImportState::FetchKvWord() const {
  if (kv_word_ == nullptr) {
    return absl::FailedPreconditionError(
        "this CUDA import was registered without gpu_signals: it has no "
        "KV-written word");
  }
  return kv_word_->Duplicate();
}

}  // namespace hostkv
