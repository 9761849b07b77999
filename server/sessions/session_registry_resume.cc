// SessionRegistry across restarts: the ledger's records, adopted sessions
// and their resume (deploy/README.md "Restarts and upgrades").
#include <openssl/evp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/contract/session_socket.h"
#include "proto/contract/status_macros.h"
#include "server/sessions/session_registry.h"
#include "spdlog/spdlog.h"

namespace hostkv {

std::string SecretDigest(const SessionId& id) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(id.data(), id.size(), digest, &length, EVP_sha256(),
                 nullptr) != 1 ||
      length != 32) {
    spdlog::critical("SHA-256 failed: cannot record sessions");
    std::abort();
  }
  return std::string(reinterpret_cast<const char*>(digest), length);
}

void SessionRegistry::Record(const Session& session) const {
  if (ledger_ == nullptr) return;
  SessionRecord r;
  r.tag = session.tag();
  const std::optional<PeerCredentials> peer = session.peer();
  r.verified = peer.has_value();
  if (peer.has_value()) {
    r.uid = peer->uid;
    r.gid = peer->gid;
    r.pid = peer->pid;
  } else {
    r.pid = session.pid();
  }
  r.opened_unix_ns = absl::ToUnixNanos(session.opened());
  r.secret_sha256 = SecretDigest(session.id());
  r.client_name = session.client_name();
  ledger_->RecordSession(r);
}

void SessionRegistry::Adopt(const std::vector<SessionRecord>& records) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  for (const SessionRecord& r : records) {
    if (r.secret_sha256.size() != 32 || adopted_tags_.contains(r.tag)) continue;
    adopted_tags_.insert(r.tag);
    adopted_[r.secret_sha256] = Adopted{r, now};
    next_tag_ = std::max(next_tag_, r.tag);
  }
}

const SessionRecord* SessionRegistry::FindAdoptedLocked(
    const SessionId& id) const {
  auto it = adopted_.find(SecretDigest(id));
  return it == adopted_.end() ? nullptr : &it->second.record;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Resume(
    const SessionId& id, std::optional<PeerCredentials> peer) {
  RETURN_IF_ERROR(CheckIdFormat(id));
  SessionRecord record;
  {
    absl::MutexLock lock(&mu_);
    if (sessions_.contains(id)) {
      return absl::FailedPreconditionError(
          "the session is open (hostkvd did not restart since it was "
          "opened): nothing to resume");
    }
    auto it = adopted_.find(SecretDigest(id));
    if (it == adopted_.end()) {
      return absl::NotFoundError(
          "no session with this id did survive the restart (the state of "
          "the hostkvd that ran before was not adopted, or the session's "
          "lease ran out before its resume)");
    }
    record = it->second.record;
    if (record.verified && (!peer.has_value() || peer->uid != record.uid)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "session ", record.tag, " belongs to uid ", record.uid,
          peer.has_value() ? absl::StrCat(", not uid ", peer->uid)
                           : std::string(": resume it over the session socket")));
    }
    // The limits a new session meets: a resume is one more open session of
    // its uid (or one more without a session socket).
    RETURN_IF_ERROR(CountOpening(peer));
    adopted_.erase(it);
    adopted_tags_.erase(record.tag);
  }
  absl::StatusOr<std::shared_ptr<Session>> session = MakeSession(
      id, record.tag, record.client_name,
      peer.has_value() ? peer->pid : record.pid, peer);
  absl::MutexLock lock(&mu_);
  --opening_;
  if (!session.ok()) {
    // Back to waiting: its pages stay until its lease runs out.
    if (peer.has_value()) {
      --attached_per_uid_[peer->uid];
    } else {
      --unattached_;
    }
    adopted_tags_.insert(record.tag);
    adopted_[record.secret_sha256] = Adopted{record, absl::Now()};
    return session.status();
  }
  sessions_[id] = *session;
  Record(**session);
  return *session;
}

std::vector<OwnerTag> SessionRegistry::ExpireAdopted(absl::Time cutoff) {
  std::vector<OwnerTag> tags;
  absl::MutexLock lock(&mu_);
  for (auto it = adopted_.begin(); it != adopted_.end();) {
    if (it->second.since >= cutoff) {
      ++it;
      continue;
    }
    tags.push_back(it->second.record.tag);
    adopted_tags_.erase(it->second.record.tag);
    if (ledger_ != nullptr) ledger_->EraseSession(it->second.record.tag);
    adopted_.erase(it++);
  }
  return tags;
}

std::optional<OwnerTag> SessionRegistry::DropAdopted(const SessionId& id) {
  if (id.size() != kSessionIdBytes) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = adopted_.find(SecretDigest(id));
  if (it == adopted_.end()) return std::nullopt;
  const OwnerTag tag = it->second.record.tag;
  adopted_tags_.erase(tag);
  if (ledger_ != nullptr) ledger_->EraseSession(tag);
  adopted_.erase(it);
  return tag;
}

size_t SessionRegistry::adopted_waiting() const {
  absl::MutexLock lock(&mu_);
  return adopted_.size();
}

}  // namespace hostkv
