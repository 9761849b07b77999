// Open sessions by their secret id, and the limits on how many there may be.
#ifndef HOSTKV_SERVER_SESSIONS_SESSION_REGISTRY_H_
#define HOSTKV_SERVER_SESSIONS_SESSION_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/pool/memory_budget.h"
#include "server/sessions/session.h"
#include "server/state/daemon_ledger.h"

namespace hostkv {

struct SessionLimits {
  // Sessions open at once, all users together.
  uint32_t max_sessions = 4096;
  // Attached sessions of one uid.
  uint32_t max_sessions_per_uid = 256;
  // Sessions without a session socket (TCP, raw gRPC clients, and sessions
  // between OpenSession and their attach): their user is unknown.
  uint32_t max_unattached_sessions = 64;
};

// Thread-safe. Session ids are 16 bytes from getrandom(2): unguessable, and
// never part of a name, log line, error message or stat.
class SessionRegistry {
 public:
  // Signal segments are named "<segment_prefix>signals.<session number>";
  // their bytes are reserved from `budget` (may be null).
  SessionRegistry(std::string segment_prefix, uint32_t signal_records,
                  SessionLimits limits = {}, MemoryBudget* budget = nullptr);

  // Opens a session; with `peer`, it is attached to that peer from the start
  // (opened over the session socket). InvalidArgument for a client_name
  // longer than 200 bytes; ResourceExhausted, naming the limit,
  // when a limit is reached or the budget cannot hold its signal segment.
  absl::StatusOr<std::shared_ptr<Session>> Open(
      const std::string& client_name, uint32_t pid,
      std::optional<PeerCredentials> peer = std::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Binds an open session to the peer of its session socket. NotFound for
  // an unknown session, FailedPrecondition if attached already,
  // ResourceExhausted if the peer's uid has --max_sessions_per_uid attached
  // sessions.
  absl::Status Attach(const SessionId& id, const PeerCredentials& peer)
      ABSL_LOCKS_EXCLUDED(mu_);

  // InvalidArgument for an id that is not 16 bytes; NotFound for an unknown
  // (or already closed) session. Counts as activity of the session
  // (Session::Touch).
  absl::StatusOr<std::shared_ptr<Session>> Get(const SessionId& id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The session with public number `number`; NotFound if none.
  absl::StatusOr<std::shared_ptr<Session>> FindByNumber(OwnerTag number) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Sessions without an attached socket and without a request since
  // `cutoff`.
  std::vector<std::shared_ptr<Session>> IdleSince(absl::Time cutoff) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Removes the session from the registry and returns it (the caller
  // releases what it holds). NotFound if unknown.
  absl::StatusOr<std::shared_ptr<Session>> Remove(const SessionId& id)
      ABSL_LOCKS_EXCLUDED(mu_);

  // By session number.
  std::vector<std::shared_ptr<Session>> List() const ABSL_LOCKS_EXCLUDED(mu_);

  // Remembers why session `id` ended ("closed", "disconnected",
  // "lease_expired"), so that later requests naming it learn why (the last
  // 1024 ended sessions).
  void RecordEnd(const SessionId& id, const std::string& reason)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Tags of the live sessions of `peer_uid` (nullopt: the sessions without
  // a verified peer).
  std::vector<OwnerTag> TagsOfUid(std::optional<uint32_t> peer_uid) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Imports held by the attached sessions of `uid`.
  uint32_t ImportsOfUid(uint32_t uid) const ABSL_LOCKS_EXCLUDED(mu_);

  const SessionLimits& limits() const { return limits_; }

  // ---- Restarts (deploy/README.md "Restarts and upgrades") ----
  // Every session opened, attached or resumed from now on is written to
  // `ledger` (may be null), and erased from it when it ends. Set before the
  // registry is shared.
  void set_ledger(DaemonLedger* ledger) { ledger_ = ledger; }
  // The sessions a previous daemon left in its ledger: they wait for their
  // clients to resume them (Resume), and their tags are never given to a
  // new session. Call before the registry is shared.
  void Adopt(const std::vector<SessionRecord>& records) ABSL_LOCKS_EXCLUDED(mu_);
  // Resumes the adopted session whose secret is `id`: the same number (and
  // so the same pages), a new signal segment, attached to `peer` when given.
  // NotFound ("did not survive") if no adopted session has this secret;
  // PermissionDenied if the session was attached and `peer` is not of its
  // uid (or absent); errors of Open's limits and budget.
  absl::StatusOr<std::shared_ptr<Session>> Resume(
      const SessionId& id, std::optional<PeerCredentials> peer)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the adopted sessions not resumed since `cutoff` and returns
  // their tags (the caller frees their pages).
  std::vector<OwnerTag> ExpireAdopted(absl::Time cutoff) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the adopted session whose secret is `id`; its tag (the caller
  // frees its pages), or nullopt if there is none.
  std::optional<OwnerTag> DropAdopted(const SessionId& id) ABSL_LOCKS_EXCLUDED(mu_);
  // Adopted sessions still waiting for their resume.
  size_t adopted_waiting() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A session of `tag` with a new signal segment (reserved from the
  // budget). The caller counted it.
  absl::StatusOr<std::shared_ptr<Session>> MakeSession(
      SessionId id, OwnerTag tag, const std::string& client_name, uint32_t pid,
      const std::optional<PeerCredentials>& peer);
  // Writes the session to the ledger, if any.
  void Record(const Session& session) const;
  // The adopted session with the secret `id`, or nullptr.
  const SessionRecord* FindAdoptedLocked(const SessionId& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckIdFormat(const SessionId& id) const;
  // NotFound for `id`, saying why if it ended recently.
  absl::Status Unknown(const SessionId& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back the count Open or Attach took for `session`.
  void Uncount(const Session& session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The limits a session being opened or resumed meets (--max_sessions, and
  // --max_sessions_per_uid or --max_unattached_sessions); counts it as
  // opening (and toward its uid) when they allow it.
  absl::Status CountOpening(const std::optional<PeerCredentials>& peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string segment_prefix_;
  const uint32_t signal_records_;
  const SessionLimits limits_;
  MemoryBudget* const budget_;

  mutable absl::Mutex mu_;
  OwnerTag next_tag_ ABSL_GUARDED_BY(mu_) = kNoOwner;
  absl::flat_hash_map<SessionId, std::shared_ptr<Session>> sessions_
      ABSL_GUARDED_BY(mu_);
  uint32_t opening_ ABSL_GUARDED_BY(mu_) = 0;  // counted, not yet in sessions_
  uint32_t unattached_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint32_t, uint32_t> attached_per_uid_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SessionId, std::string> ended_ ABSL_GUARDED_BY(mu_);
  std::deque<SessionId> ended_order_ ABSL_GUARDED_BY(mu_);
  DaemonLedger* ledger_ = nullptr;
  // Adopted sessions waiting for their resume, by the SHA-256 of their
  // secret, with the time they were adopted.
  struct Adopted {
    SessionRecord record;
    absl::Time since;
  };
  absl::flat_hash_map<std::string, Adopted> adopted_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<OwnerTag> adopted_tags_ ABSL_GUARDED_BY(mu_);
};

// The SHA-256 of a session secret: all the daemon ledger keeps of it.
std::string SecretDigest(const SessionId& id);

// kSessionIdBytes random bytes from the kernel (getrandom).
SessionId NewSessionId();

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SESSIONS_SESSION_REGISTRY_H_
