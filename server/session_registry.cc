#include "server/session_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/contract/status_macros.h"

namespace hostkv {

SessionRegistry::SessionRegistry(std::string segment_prefix,
                                 uint32_t signal_records)
    : segment_prefix_(std::move(segment_prefix)),
      signal_records_(signal_records),
      rng_(std::random_device{}()) {}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Open(
    const std::string& client_name, uint32_t pid) {
  uint64_t id;
  OwnerTag tag;
  {
    absl::MutexLock lock(&mu_);
    do {
      id = rng_();
    } while (id == 0 || sessions_.contains(id));
    if (++next_tag_ == kNoOwner) ++next_tag_;  // wraps after 2^32 sessions
    tag = next_tag_;
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<SignalBoard> signals,
      SignalBoard::Create(absl::StrFormat("%ssignals.%016x", segment_prefix_, id),
                          signal_records_));
  auto session = std::make_shared<Session>(id, tag, client_name, pid,
                                           std::move(signals));
  absl::MutexLock lock(&mu_);
  sessions_[id] = session;
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Get(
    uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no open session ", id, " (never opened, or closed)"));
  }
  it->second->Touch();
  return it->second;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::FindByNumber(
    OwnerTag number) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, session] : sessions_) {
    if (session->tag() == number) return session;
  }
  return absl::NotFoundError(absl::StrCat("no open session number ", number));
}

std::vector<std::shared_ptr<Session>> SessionRegistry::IdleSince(
    absl::Time cutoff) const {
  std::vector<std::shared_ptr<Session>> idle;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, session] : sessions_) {
    if (!session->attached() && session->last_active() < cutoff) {
      idle.push_back(session);
    }
  }
  return idle;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Remove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no open session ", id, " (never opened, or closed)"));
  }
  std::shared_ptr<Session> session = std::move(it->second);
  sessions_.erase(it);
  return session;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::List() const {
  std::vector<std::shared_ptr<Session>> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : sessions_) out.push_back(s);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a->id() < b->id(); });
  return out;
}

}  // namespace hostkv
