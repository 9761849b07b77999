// The "KV written" word of one CUDA import, in host memory the daemon owns:
// one 4 KiB page of a sealed memfd. The daemon maps it (and, in the CUDA
// backend, registers it with cudaHostRegister so that the import's stream
// can cuStreamWaitValue64 on it); the engine gets the memfd over the
// session socket (SessionMessageKind::kFetchKvWord), maps and registers it
// too, and its stream writes the growing mark with cuStreamWriteValue64.
// Releasing every wait on it is a plain CPU store: no stream is involved,
// so a release can never queue behind the wait it releases.
#ifndef HOSTKV_SERVER_TRANSFER_KV_WORD_PAGE_H_
#define HOSTKV_SERVER_TRANSFER_KV_WORD_PAGE_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "proto/contract/shm_segment.h"

namespace hostkv {

// Owns the memfd and the daemon's mapping of it. Thread-safe: the word is
// read and written atomically. Move-free (its address is handed to CUDA).
class KvWordPage {
 public:
  static constexpr uint64_t kPageBytes = 4096;
  // What Release stores: the largest value CU_STREAM_WAIT_VALUE_GEQ (a
  // wrapping comparison) sees as >= every permitted wait_kv_written.
  static constexpr uint64_t kReleased = (1ull << 63) - 1;

  // Creates a zeroed page: memfd_create, one page, sealed against shrinking,
  // growing and further sealing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
  // mapped shared read-write. Internal if the kernel refuses any step.
  static absl::StatusOr<std::unique_ptr<KvWordPage>> Create();
  ~KvWordPage();
  KvWordPage(const KvWordPage&) = delete;
  KvWordPage& operator=(const KvWordPage&) = delete;

  // The page's memfd (owned; dup it to hand it out).
  int fd() const { return fd_.get(); }
  // The page, for cudaHostRegister.
  void* page() const { return page_; }
  // The word: the first 8 bytes of the page.
  uint64_t* word() const { return static_cast<uint64_t*>(page_); }

  uint64_t Load() const;
  // Stores kReleased: every wait on the word passes, now and later.
  void Release();
  // A duplicate of fd() (close-on-exec) for the engine. Internal on failure.
  absl::StatusOr<ScopedFd> Duplicate() const;

 private:
  KvWordPage(ScopedFd fd, void* page) : fd_(std::move(fd)), page_(page) {}

  const ScopedFd fd_;
  void* const page_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TRANSFER_KV_WORD_PAGE_H_
