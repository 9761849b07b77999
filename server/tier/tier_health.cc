#include "server/tier/tier_health.h"

#include <utility>

#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

// A key no page is stored under: the probe asks whether it exists.
const TierKey& ProbeKey() {
  static const TierKey* key = new TierKey{"hostkv.probe", "probe"};
  return *key;
}

}  // namespace

TierHealth::TierHealth(PageTier* tier, absl::Duration probe_interval)
    : tier_(tier), probe_interval_(probe_interval) {
  Report(tier_->CountPrefix({&ProbeKey(), 1}).status());
  prober_ = std::thread([this] { ProbeLoop(); });
}

TierHealth::~TierHealth() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  prober_.join();
}

void TierHealth::SetObserver(Observer observer) {
  absl::MutexLock lock(&mu_);
  observer_ = std::move(observer);
  notified_serving_ = serving();
  if (observer_) observer_(notified_serving_);
}

bool TierHealth::writable() const {
  if (!up()) return false;
  if (!full_.load(std::memory_order_acquire)) return true;
  return absl::GetCurrentTimeNanos() >=
         retry_write_at_ns_.load(std::memory_order_acquire);
}

void TierHealth::NotifyLocked() {
  const bool now = serving();
  if (now == notified_serving_) return;
  notified_serving_ = now;
  if (observer_) observer_(now);
}

void TierHealth::ReportWrite(const absl::Status& status) {
  if (!absl::IsResourceExhausted(status)) {
    if (status.ok() && full_.load(std::memory_order_acquire)) {
      absl::MutexLock lock(&mu_);
      if (full_.exchange(false)) {
        spdlog::info("tier {}: takes writes again", tier_->Describe());
        if (up()) last_error_.clear();
        NotifyLocked();
      }
    }
    Report(status);
    return;
  }
  retry_write_at_ns_.store(
      absl::GetCurrentTimeNanos() + absl::ToInt64Nanoseconds(probe_interval_),
      std::memory_order_release);
  absl::MutexLock lock(&mu_);
  if (!full_.exchange(true)) {
    last_error_ = std::string(status.message());
    spdlog::warn("tier {}: full, NOT serving ({}); lookups still read it, "
                 "writes are dropped and retried every {}",
                 tier_->Describe(), status.ToString(),
                 absl::FormatDuration(probe_interval_));
    NotifyLocked();
  }
}

std::string TierHealth::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

bool TierHealth::MeansDown(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsUnauthenticated(status) || absl::IsPermissionDenied(status);
}

void TierHealth::Report(const absl::Status& status) {
  const bool now_up = !MeansDown(status);
  if (up_.load(std::memory_order_acquire) == now_up) return;
  absl::MutexLock lock(&mu_);
  if (up_.load(std::memory_order_relaxed) == now_up) return;
  up_.store(now_up, std::memory_order_release);
  if (now_up) {
    spdlog::info("tier {}: answers{}", tier_->Describe(),
                 full_.load() ? " (still full)" : ": serving");
    if (!full_.load()) last_error_.clear();
  } else {
    last_error_ = std::string(status.message());
    spdlog::warn("tier {}: NOT serving ({}); lookups miss and writes are "
                 "dropped until it answers again",
                 tier_->Describe(), status.ToString());
  }
  NotifyLocked();
}

void TierHealth::ProbeLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      const auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_;
      };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), probe_interval_)) {
        return;
      }
    }
    Report(tier_->CountPrefix({&ProbeKey(), 1}).status());
  }
}

}  // namespace hostkv
