#include "server/transfer/kv_word_page.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace hostkv {
namespace {

absl::Status Errno(const char* what) {
  return absl::InternalError(
      absl::StrCat("KV-written page: ", what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvWordPage>> KvWordPage::Create() {
  ScopedFd fd(memfd_create("hostkv-kv-word", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd.get() < 0) return Errno("memfd_create");
  if (ftruncate(fd.get(), kPageBytes) != 0) return Errno("ftruncate");
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
      0) {
    return Errno("F_ADD_SEALS");
  }
  void* page = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                    fd.get(), 0);
  if (page == MAP_FAILED) return Errno("mmap");
  return std::unique_ptr<KvWordPage>(new KvWordPage(std::move(fd), page));
}

KvWordPage::~KvWordPage() { munmap(page_, kPageBytes); }

uint64_t KvWordPage::Load() const {
  return std::atomic_ref<uint64_t>(*word()).load(std::memory_order_acquire);
}

void KvWordPage::Release() {
  std::atomic_ref<uint64_t>(*word()).store(kReleased,
                                           std::memory_order_release);
}

absl::StatusOr<ScopedFd> KvWordPage::Duplicate() const {
  ScopedFd copy(fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
  if (copy.get() < 0) return Errno("F_DUPFD_CLOEXEC");
  return copy;
}

}  // namespace hostkv
