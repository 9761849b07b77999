#include "server/sessions/signal_board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/contract/status_macros.h"

namespace hostkv {
namespace {

// 64 random bits, never 0 (0 is "no id": a daemon before ids existed).
uint64_t RandomSegmentId() {
  uint64_t id = 0;
  while (id == 0) {
    if (getrandom(&id, sizeof(id), 0) != static_cast<ssize_t>(sizeof(id))) {
      id = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&id)) ^
           static_cast<uint64_t>(std::chrono::steady_clock::now()
                                     .time_since_epoch()
                                     .count());
    }
  }
  return id;
}

}  // namespace

absl::StatusOr<std::shared_ptr<SignalBoard>> SignalBoard::Create(
    const std::string& name, uint32_t records) {
  ASSIGN_OR_RETURN(ShmSegment segment,
                   ShmSegment::Create(name, uint64_t{records} * sizeof(OpSignal),
                                      0640));
  return std::shared_ptr<SignalBoard>(
      new SignalBoard(std::move(segment), records));
}

SignalBoard::SignalBoard(ShmSegment segment, uint32_t records)
    : segment_(std::move(segment)),
      records_(records),
      id_(RandomSegmentId()),
      busy_(records, false) {}

std::string SignalBoard::name() const {
  absl::MutexLock lock(&mu_);
  return named_ ? segment_.name() : std::string();
}

absl::StatusOr<ScopedFd> SignalBoard::TakeReadOnlyFd() {
  absl::MutexLock lock(&mu_);
  if (!named_) {
    return absl::FailedPreconditionError("the signal segment was handed out already");
  }
  ScopedFd fd(shm_open(segment_.name().c_str(), O_RDONLY | O_CLOEXEC, 0));
  if (fd.get() < 0) {
    return absl::InternalError(absl::StrCat("cannot reopen the signal segment: ",
                                            std::strerror(errno)));
  }
  segment_.Unlink();
  named_ = false;
  return fd;
}

absl::StatusOr<uint32_t> SignalBoard::Claim(uint64_t op_id) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return absl::UnavailableError("the session is closing");
  if (in_flight_ == records_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "all ", records_, " completion records of the session are in use by "
        "operations in flight; wait for some to finish"));
  }
  while (busy_[next_]) next_ = (next_ + 1) % records_;
  const uint32_t index = next_;
  next_ = (next_ + 1) % records_;
  busy_[index] = true;
  ++in_flight_;
  BeginOpSignal(record(index), op_id);
  return index;
}

void SignalBoard::Publish(uint32_t index, uint32_t layers_done) {
  PublishLayersDone(record(index), layers_done);
}

void SignalBoard::Finish(uint32_t index, bool failed) {
  if (failed) PublishFailure(record(index));
  absl::MutexLock lock(&mu_);
  busy_[index] = false;
  --in_flight_;
}

void SignalBoard::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

bool SignalBoard::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void SignalBoard::AwaitIdle() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_ == 0;
  };
  mu_.Await(absl::Condition(&idle));
}

uint32_t SignalBoard::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

}  // namespace hostkv
