#include "server/tier/tier_health.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

// Keys no page is stored under: the probe asks for them in one batch. In a
// cluster their slots spread over the masters, so that one master down
// costs its own keys, not the whole tier: the tier is up while any of them
// answers.
constexpr int kProbeKeys = 16;

const std::vector<TierKey>& ProbeKeys() {
  static const std::vector<TierKey>* keys = [] {
    auto* k = new std::vector<TierKey>;
    for (int i = 0; i < kProbeKeys; ++i) {
      k->push_back({"hostkv.probe", absl::StrCat("probe-", i)});
    }
    return k;
  }();
  return *keys;
}

}  // namespace

TierHealth::TierHealth(PageTier* tier, absl::Duration probe_interval)
    : tier_(tier), probe_interval_(probe_interval) {
  const absl::Status first = Probe();
  Report(first);
  if (!up()) {  // down from the start: Report saw no change to log
    absl::MutexLock lock(&mu_);
    last_error_ = std::string(first.message());
    spdlog::warn("tier {}: NOT serving at start ({}); lookups miss and "
                 "writes are dropped until it answers",
                 tier_->Describe(), first.ToString());
  }
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

absl::Status TierHealth::Probe() {
  std::vector<absl::Status> replies;
  for (const absl::StatusOr<std::string>& value : tier_->Get(ProbeKeys())) {
    replies.push_back(value.status());
  }
  return AnyAnswered(replies);
}

absl::Status TierHealth::AnyAnswered(absl::Span<const absl::Status> replies) {
  absl::Status down = absl::UnavailableError("no reply");
  for (const absl::Status& status : replies) {
    if (!MeansDown(status)) return absl::OkStatus();
    down = status;
  }
  return down;
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
    Report(Probe());
  }
}

}  // namespace hostkv
