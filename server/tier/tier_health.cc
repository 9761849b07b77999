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
  Report(Probe());
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
  if (observer_) observer_(up());
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
    spdlog::info("tier {}: serving", tier_->Describe());
    last_error_.clear();
  } else {
    last_error_ = std::string(status.message());
    spdlog::warn("tier {}: NOT serving ({}); lookups miss and writes are "
                 "dropped until it answers again",
                 tier_->Describe(), status.ToString());
  }
  if (observer_) observer_(now_up);
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
