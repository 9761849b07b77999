// GpuImportState with CUDA: the mappings of one registration's buffers, the
// stream its operations run on, and its signal words.
#ifndef HOSTKV_SERVER_CUDA_CUDA_IMPORT_H_
#define HOSTKV_SERVER_CUDA_CUDA_IMPORT_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/driver_api.h"
#include "server/cuda/ipc_mappings.h"
#include "server/transfer/gpu_backend.h"
#include "server/transfer/kv_word_page.h"
#include "server/transfer/signal_sequence.h"

namespace hostkv {

class CudaImportState : public GpuImportState {
 public:
  // What ReleaseWaits writes to "KV written": the largest value that
  // CU_STREAM_WAIT_VALUE_GEQ (a wrapping comparison) sees as >= every
  // permitted wait_kv_written (<= 2^63 - 1).
  static constexpr uint64_t kReleasedKvWritten = KvWordPage::kReleased;

  // Creates the import's stream on `device`. `signal_words` (in the
  // daemon's mapping, or null) has num_layers words, the per-layer words in
  // the engine's device memory; signal values continue above what they hold
  // already. With them, the import gets its "KV written" word: a fresh
  // KvWordPage registered with CUDA (mapped), which the engine fetches.
  // `on_close` runs when the import is closed, after its streams are idle;
  // on error it has not run and is not kept (the caller runs it).
  static absl::StatusOr<std::unique_ptr<CudaImportState>> Create(
      int device, std::vector<IpcMappingRef> mappings, uint64_t* signal_words,
      uint32_t num_layers, std::function<void()> on_close);
  // Waits for the import's stream, then destroys it and closes its mappings.
  ~CudaImportState() override;

  int device() const override { return device_; }
  bool has_signals() const override { return signal_words_ != nullptr; }
  absl::StatusOr<uint64_t> NextSignalValue() override {
    return signal_values_.Next();
  }
  absl::Status ClaimSignalValue(uint64_t value) override {
    return signal_values_.Claim(value);
  }
  void ReleaseWaits() override;
  absl::StatusOr<ScopedFd> FetchKvWord() const override;
  // ReleaseWaits was called: "KV written" no longer means the engine wrote.
  bool released() const { return released_.load(); }

  cudaStream_t stream() const { return stream_; }
  // word[l] for layer l (engine device memory); null without them.
  uint64_t* signal_words() const { return signal_words_; }
  // The device address of the "KV written" word (in the daemon's host
  // page); null without signal words.
  void* kv_word_device() const {
    return kv_word_registration_.device_address();
  }
  uint32_t num_layers() const { return num_layers_; }

 private:
  CudaImportState(int device, std::vector<IpcMappingRef> mappings,
                  uint64_t* signal_words, uint32_t num_layers)
      : device_(device),
        mappings_(std::move(mappings)),
        signal_words_(signal_words),
        num_layers_(num_layers) {}

  const int device_;
  std::vector<IpcMappingRef> mappings_;
  uint64_t* const signal_words_;
  const uint32_t num_layers_;
  SignalSequence signal_values_;
  std::atomic<bool> released_{false};
  std::function<void()> on_close_;
  cudaStream_t stream_ = nullptr;
  // "KV written" (with signal words): unregistered before it is unmapped.
  std::unique_ptr<KvWordPage> kv_word_;
  HostRegistration kv_word_registration_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CUDA_CUDA_IMPORT_H_
