#include "server/service/ring_quota.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/operations/descriptor_shares.h"
#include "server/service/ring_threads.h"

namespace hostkv {

RingCpuAccount::RingCpuAccount(double cores, absl::Duration burst)
    : cores_(cores),
      burst_(burst),
      max_running_(cores > 0 ? static_cast<uint32_t>(std::ceil(cores)) : 0),
      // Full at first: a ring that alone uses at most one core of a share
      // of one core or more never waits. A uid that closes its last ring
      // and opens another (a new session and ring) gets at most one burst.
      balance_(burst),
      filled_(absl::Now()),
      charged_(absl::ZeroDuration()) {}

void RingCpuAccount::Refill(absl::Time now) {
  if (now > filled_) {
    balance_ = std::min(burst_, balance_ + (now - filled_) * cores_);
    filled_ = now;
  }
}

void RingCpuAccount::Charge(absl::Duration cpu) {
  absl::MutexLock lock(&mu_);
  charged_ += cpu;
  if (cores_ <= 0) return;
  Refill(absl::Now());
  balance_ -= cpu;
}

absl::Duration RingCpuAccount::Overdrawn() {
  absl::MutexLock lock(&mu_);
  if (cores_ <= 0) return absl::ZeroDuration();
  Refill(absl::Now());
  if (balance_ >= absl::ZeroDuration()) return absl::ZeroDuration();
  return -balance_ / cores_;
}

bool RingCpuAccount::BeginCall(absl::FunctionRef<bool()> stopped) {
  absl::MutexLock lock(&mu_);
  if (max_running_ != 0) {
    auto turn = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return running_ < max_running_;
    };
    // Asks `stopped` now and then: it is not under mu_.
    while (
        !mu_.AwaitWithTimeout(absl::Condition(&turn), absl::Milliseconds(20))) {
      if (stopped()) return false;
    }
  }
  ++running_;
  return true;
}

void RingCpuAccount::EndCall() {
  absl::MutexLock lock(&mu_);
  --running_;
}

absl::Duration RingCpuAccount::charged() const {
  absl::MutexLock lock(&mu_);
  return charged_;
}

struct RingGrant::Shared {
  struct Uid {
    uint32_t rings = 0;
    std::shared_ptr<RingCpuAccount> cpu;
    std::shared_ptr<RingThreads> threads;
  };
  absl::Mutex mu;
  uint32_t rings ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<uid_t, Uid> uids ABSL_GUARDED_BY(mu);
};

RingGrant::RingGrant(std::shared_ptr<Shared> quota, uid_t uid,
                     std::shared_ptr<RingCpuAccount> cpu,
                     std::shared_ptr<RingThreads> threads,
                     BudgetReservation memory)
    : quota_(std::move(quota)),
      uid_(uid),
      cpu_(std::move(cpu)),
      threads_(std::move(threads)),
      memory_(std::move(memory)) {}

RingGrant& RingGrant::operator=(RingGrant&& o) noexcept {
  if (this != &o) {
    GiveBack();
    quota_ = std::move(o.quota_);
    uid_ = o.uid_;
    cpu_ = std::move(o.cpu_);
    threads_ = std::move(o.threads_);
    memory_ = std::move(o.memory_);
  }
  return *this;
}

RingGrant::~RingGrant() { GiveBack(); }

void RingGrant::GiveBack() {
  memory_ = BudgetReservation();
  cpu_.reset();
  threads_.reset();
  if (quota_ == nullptr) return;
  std::shared_ptr<RingThreads> last_threads;  // joined outside the lock
  {
    absl::MutexLock lock(&quota_->mu);
    --quota_->rings;
    auto it = quota_->uids.find(uid_);
    if (it != quota_->uids.end() && --it->second.rings == 0) {
      last_threads = std::move(it->second.threads);
      quota_->uids.erase(it);
    }
  }
  quota_.reset();
}

RingQuota::RingQuota(RingLimits limits, MemoryBudget* budget)
    : limits_(limits),
      budget_(budget),
      shared_(std::make_shared<RingGrant::Shared>()) {}

absl::StatusOr<RingGrant> RingQuota::Grant(uid_t uid, uint64_t segment_bytes) {
  absl::MutexLock lock(&shared_->mu);
  if (shared_->rings >= limits_.max_rings) {
    return absl::ResourceExhaustedError(
        absl::StrCat(shared_->rings,
                     " command rings run, the most this daemon serves "
                     "(--max_command_rings); use gRPC"));
  }
  RingGrant::Shared::Uid& of_uid = shared_->uids[uid];
  if (of_uid.rings >= limits_.max_rings_per_uid) {
    const uint32_t held = of_uid.rings;
    if (held == 0) shared_->uids.erase(uid);
    return absl::ResourceExhaustedError(
        absl::StrCat("uid ", uid, " holds ", held,
                     " command rings, the most one user may "
                     "(--max_command_rings_per_uid); use gRPC"));
  }
  if (limits_.max_rings != 0 &&
      !MayTakeShared(of_uid.rings, shared_->rings, limits_.max_rings)) {
    const uint32_t held = of_uid.rings;
    if (held == 0) shared_->uids.erase(uid);
    return absl::ResourceExhaustedError(absl::StrCat(
        shared_->rings, " command rings run; the last of the ",
        limits_.max_rings, " this daemon serves are kept for users holding "
        "few, and uid ", uid, " holds ", held, "; use gRPC"));
  }
  BudgetReservation memory;
  if (budget_ != nullptr) {
    if (absl::Status s = budget_->Reserve("a command ring", segment_bytes);
        !s.ok()) {
      if (of_uid.rings == 0) shared_->uids.erase(uid);
      return s;
    }
    memory = BudgetReservation(budget_, segment_bytes);
  }
  if (of_uid.cpu == nullptr) {
    of_uid.cpu = std::make_shared<RingCpuAccount>(limits_.cpu_per_uid,
                                                  limits_.cpu_burst);
    // As many threads as calls the share lets run at once (0: a thread per
    // ring where there is no bound).
    const size_t threads =
        limits_.cpu_per_uid > 0
            ? static_cast<size_t>(std::ceil(limits_.cpu_per_uid))
            : 0;
    of_uid.threads =
        std::make_shared<RingThreads>(threads, of_uid.cpu, limits_.spin);
  }
  ++of_uid.rings;
  ++shared_->rings;
  return RingGrant(shared_, uid, of_uid.cpu, of_uid.threads,
                   std::move(memory));
}

uint32_t RingQuota::rings() const {
  absl::MutexLock lock(&shared_->mu);
  return shared_->rings;
}

uint32_t RingQuota::rings_of(uid_t uid) const {
  absl::MutexLock lock(&shared_->mu);
  auto it = shared_->uids.find(uid);
  return it == shared_->uids.end() ? 0 : it->second.rings;
}

std::shared_ptr<RingThreads> RingQuota::threads_of(uid_t uid) const {
  absl::MutexLock lock(&shared_->mu);
  auto it = shared_->uids.find(uid);
  return it == shared_->uids.end() ? nullptr : it->second.threads;
}

}  // namespace hostkv
