#include "server/sessions/session_registry.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "proto/contract/op_signal.h"
#include "proto/contract/session_socket.h"
#include "proto/contract/status_macros.h"
#include "server/operations/descriptor_shares.h"
#include "spdlog/spdlog.h"

namespace hostkv {

SessionId NewSessionId() {
  SessionId id(kSessionIdBytes, '\0');
  size_t got = 0;
  while (got < id.size()) {
    const ssize_t n = getrandom(id.data() + got, id.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // Without the kernel's randomness a session id would be guessable.
      spdlog::critical("getrandom failed: cannot make session ids");
      std::abort();
    }
    got += static_cast<size_t>(n);
  }
  return id;
}

SessionRegistry::SessionRegistry(std::string segment_prefix,
                                 uint32_t signal_records, SessionLimits limits,
                                 MemoryBudget* budget)
    : segment_prefix_(std::move(segment_prefix)),
      signal_records_(signal_records),
      limits_(limits),
      budget_(budget) {}

absl::Status SessionRegistry::CheckIdFormat(const SessionId& id) const {
  if (id.size() != kSessionIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_id must be the ", kSessionIdBytes,
                     " bytes OpenSession returned, got ", id.size(), " bytes"));
  }
  return absl::OkStatus();
}

absl::Status SessionRegistry::CountOpening(
    const std::optional<PeerCredentials>& peer) {
  const size_t open = sessions_.size() + opening_;
  if (open >= limits_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        open, " sessions are open, the most --max_sessions allows"));
  }
  if (peer.has_value()) {
    uint32_t& count = attached_per_uid_[peer->uid];
    if (count >= limits_.max_sessions_per_uid) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "uid ", peer->uid, " has ", count,
          " sessions open, the most --max_sessions_per_uid allows"));
    }
    if (!MayTakeShared(count, open, limits_.max_sessions)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          open, " sessions are open; the last of the ",
          limits_.max_sessions, " --max_sessions allows are kept for users "
          "holding few, and uid ", peer->uid, " has ", count));
    }
    ++count;
  } else {
    if (unattached_ >= limits_.max_unattached_sessions) {
      return absl::ResourceExhaustedError(absl::StrCat(
          unattached_,
          " sessions without a session socket are open, the "
          "most --max_unattached_sessions allows (clients on the daemon's "
          "Unix socket open theirs over the session socket instead)"));
    }
    ++unattached_;
  }
  ++opening_;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Open(
    const std::string& client_name, uint32_t pid,
    std::optional<PeerCredentials> peer) {
  // One check for both ways in (the RPC and the session socket).
  constexpr size_t kMaxClientNameBytes = 200;
  if (client_name.size() > kMaxClientNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client_name is longer than ", kMaxClientNameBytes, " bytes"));
  }
  SessionId id = NewSessionId();
  OwnerTag tag;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CountOpening(peer));
    while (sessions_.contains(id)) id = NewSessionId();
    do {  // wraps after 2^32 sessions, skipping the reserved tags
      ++next_tag_;
    } while (next_tag_ == kNoOwner || next_tag_ == kCacheOwner ||
             next_tag_ == kTierOwner || next_tag_ == kUnscrubbedMark ||
             adopted_tags_.contains(next_tag_));
    tag = next_tag_;
  }
  auto uncount = [&] {
    absl::MutexLock lock(&mu_);
    --opening_;
    if (peer.has_value()) {
      --attached_per_uid_[peer->uid];
    } else {
      --unattached_;
    }
  };
  absl::StatusOr<std::shared_ptr<Session>> session =
      MakeSession(id, tag, client_name, pid, peer);
  if (!session.ok()) {
    uncount();
    return session.status();
  }
  Record(**session);
  absl::MutexLock lock(&mu_);
  --opening_;
  sessions_[id] = *session;
  return *session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::MakeSession(
    SessionId id, OwnerTag tag, const std::string& client_name, uint32_t pid,
    const std::optional<PeerCredentials>& peer) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t signal_bytes =
      (uint64_t{signal_records_} * sizeof(OpSignal) + page - 1) / page * page;
  BudgetReservation memory;
  if (budget_ != nullptr) {
    if (absl::Status s = budget_->Reserve(
            absl::StrCat("session ", tag, "'s signal records"), signal_bytes);
        !s.ok()) {
      return s;
    }
    memory = BudgetReservation(budget_, signal_bytes);
  }
  // Named "<prefix>signals.<number>.<random>": /dev/shm is everybody's, and
  // a predictable name could be taken first by a user who never connects.
  absl::StatusOr<std::shared_ptr<SignalBoard>> signals =
      absl::AlreadyExistsError("");
  for (int attempt = 0; attempt < 4 && absl::IsAlreadyExists(signals.status());
       ++attempt) {
    const SessionId nonce = NewSessionId();
    signals = SignalBoard::Create(
        absl::StrCat(segment_prefix_, "signals.", tag, ".",
                     absl::BytesToHexString(nonce.substr(0, 8))),
        signal_records_);
  }
  if (!signals.ok()) return signals.status();
  auto session = std::make_shared<Session>(
      std::move(id), tag, client_name, pid, std::move(*signals),
      std::move(memory));
  if (peer.has_value())
    session->Attach(*peer).IgnoreError();  // fresh: cannot fail
  return session;
}


absl::Status SessionRegistry::Attach(const SessionId& id,
                                     const PeerCredentials& peer) {
  RETURN_IF_ERROR(CheckIdFormat(id));
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return Unknown(id);
  }
  Session& session = *it->second;
  if (session.attached()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", session.tag(), " already has an attached socket"));
  }
  uint32_t& count = attached_per_uid_[peer.uid];
  if (count >= limits_.max_sessions_per_uid) {
    return absl::ResourceExhaustedError(
        absl::StrCat("uid ", peer.uid, " has ", count,
                     " sessions open, the most --max_sessions_per_uid allows"));
  }
  RETURN_IF_ERROR(session.Attach(peer));
  ++count;
  --unattached_;
  session.Touch();
  Record(session);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Get(
    const SessionId& id) const {
  RETURN_IF_ERROR(CheckIdFormat(id));
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it != sessions_.end()) {
      it->second->Touch();
      return it->second;
    }
    const SessionRecord* adopted =
        adopted_.empty() ? nullptr : FindAdoptedLocked(id);
    if (adopted == nullptr) return Unknown(id);
    if (adopted->verified) {
      return absl::NotFoundError(absl::StrCat(
          "session ", adopted->tag, " awaits its resume over the session "
          "socket (hostkvd restarted)"));
    }
  }
  // A session without a session socket resumes with its next call.
  return const_cast<SessionRegistry*>(this)->Resume(id, std::nullopt);
}

absl::Status SessionRegistry::Unknown(const SessionId& id) const {
  auto it = ended_.find(id);
  if (it == ended_.end()) {
    return absl::NotFoundError(
        "no open session with this id (never opened, or closed)");
  }
  if (it->second == "lease_expired") {
    return absl::NotFoundError(
        "the session's lease expired (no request within --session_lease and "
        "no session socket attached); open a new session");
  }
  if (it->second == "disconnected") {
    return absl::NotFoundError(
        "the session ended when its session socket closed; open a new session");
  }
  return absl::NotFoundError(
      absl::StrCat("the session ended (", it->second, "); open a new session"));
}

void SessionRegistry::RecordEnd(const SessionId& id,
                                const std::string& reason) {
  constexpr size_t kRemembered = 1024;
  absl::MutexLock lock(&mu_);
  if (!ended_.emplace(id, reason).second) return;
  ended_order_.push_back(id);
  if (ended_order_.size() > kRemembered) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
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

void SessionRegistry::Uncount(const Session& session) {
  const std::optional<PeerCredentials> peer = session.peer();
  if (!peer.has_value()) {
    --unattached_;
    return;
  }
  auto it = attached_per_uid_.find(peer->uid);
  if (it != attached_per_uid_.end() && --it->second == 0) {
    attached_per_uid_.erase(it);
  }
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Remove(
    const SessionId& id) {
  RETURN_IF_ERROR(CheckIdFormat(id));
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return Unknown(id);
  }
  std::shared_ptr<Session> session = std::move(it->second);
  sessions_.erase(it);
  Uncount(*session);
  if (ledger_ != nullptr) ledger_->EraseSession(session->tag());
  return session;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::List() const {
  std::vector<std::shared_ptr<Session>> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : sessions_) out.push_back(s);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a->tag() < b->tag(); });
  return out;
}

std::vector<OwnerTag> SessionRegistry::TagsOfUid(
    std::optional<uint32_t> peer_uid) const {
  std::vector<OwnerTag> tags;
  for (const std::shared_ptr<Session>& session : List()) {
    const std::optional<PeerCredentials> peer = session->peer();
    if (peer.has_value() != peer_uid.has_value()) continue;
    if (peer.has_value() && peer->uid != *peer_uid) continue;
    tags.push_back(session->tag());
  }
  return tags;
}

uint32_t SessionRegistry::ImportsOfUid(uint32_t uid) const {
  uint32_t imports = 0;
  for (const std::shared_ptr<Session>& session : List()) {
    const std::optional<PeerCredentials> peer = session->peer();
    if (peer.has_value() && peer->uid == uid)
      imports += session->import_count();
  }
  return imports;
}

}  // namespace hostkv
