#include "server/sessions/session_reaper.h"

namespace hostkv {

SessionReaper::SessionReaper(RequestHandler* handler, absl::Duration lease)
    : handler_(handler), lease_(lease), thread_([this] { Loop(); }) {}

SessionReaper::~SessionReaper() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void SessionReaper::End(SessionId id, const char* reason) {
  absl::MutexLock lock(&mu_);
  queue_.emplace_back(std::move(id), reason);
}

void SessionReaper::Loop() {
  absl::Time next_sweep = absl::Now() + absl::Seconds(1);
  while (true) {
    std::deque<std::pair<SessionId, const char*>> batch;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.AwaitWithDeadline(absl::Condition(&ready), next_sweep);
      batch.swap(queue_);
      stopping = stopping_;
    }
    // NotFound when the client closed the session itself first.
    for (const auto& [id, reason] : batch) {
      handler_->EndSession(id, reason).IgnoreError();
    }
    if (stopping) return;
    if (absl::Now() >= next_sweep) {
      handler_->ExpireIdleSessions(lease_);
      next_sweep = absl::Now() + absl::Seconds(1);
    }
  }
}

}  // namespace hostkv
