#include "proto/contract/command_ring.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace hostkv {

// Shared (not FUTEX_PRIVATE) futexes: the word lives in a segment mapped by
// two processes.
void FutexWakeShared(const std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAKE,
          INT_MAX, nullptr, nullptr, 0);
}

void FutexWaitShared(const std::atomic<uint32_t>* word, uint32_t expected,
                     absl::Duration timeout) {
  timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT,
          expected, &ts, nullptr, 0);
}

}  // namespace hostkv
