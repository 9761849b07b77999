// One connected client: its identity, its completion records and the device
// buffers it registered. Its slots live in the pools' allocators under
// tag().
#ifndef HOSTKV_SERVER_SESSIONS_SESSION_H_
#define HOSTKV_SERVER_SESSIONS_SESSION_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/transfer/device_import.h"
#include "server/pool/memory_budget.h"
#include "server/sessions/signal_board.h"
#include "server/pool/slot_allocator.h"

namespace hostkv {

// The secret a client names its session by: kSessionIdBytes random bytes.
using SessionId = std::string;

// Who is at the other end of a session's attached Unix socket: the
// credentials the kernel attached to the open/attach record
// (SCM_CREDENTIALS), and the groups of the connecting process
// (SO_PEERGROUPS).
struct PeerCredentials {
  uint32_t pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;  // supplementary groups

  // True if `gid` is the primary group or a supplementary one.
  bool InGroup(uint32_t gid) const;
};

// Thread-safe.
class Session {
 public:
  Session(SessionId id, OwnerTag tag, std::string client_name, uint32_t pid,
          std::shared_ptr<SignalBoard> signals, BudgetReservation memory);

  // The secret the client names the session by. Never logged or shown.
  const SessionId& id() const { return id_; }
  // The public number of the session (stats, logs, hand-over); also its
  // owner tag in the pools' allocators.
  OwnerTag tag() const { return tag_; }
  const std::string& client_name() const { return client_name_; }
  uint32_t pid() const { return pid_; }
  absl::Time opened() const { return opened_; }
  const std::shared_ptr<SignalBoard>& signals() const { return signals_; }

  // Liveness: the time of the last request, and whether a session socket is
  // attached (then the session lives as long as that connection).
  void Touch() { last_active_ns_.store(absl::GetCurrentTimeNanos()); }
  absl::Time last_active() const {
    return absl::FromUnixNanos(last_active_ns_.load());
  }
  // Records the peer of the attached session socket. FailedPrecondition if
  // one is attached already. (SessionRegistry::Attach counts it.)
  absl::Status Attach(const PeerCredentials& peer) ABSL_LOCKS_EXCLUDED(mu_);
  bool attached() const ABSL_LOCKS_EXCLUDED(mu_);
  // The attached peer, if any.
  std::optional<PeerCredentials> peer() const ABSL_LOCKS_EXCLUDED(mu_);

  // Set once the session is ending. Requests racing with the end re-check it
  // after allocating and give back what they took.
  void MarkEnding() { ending_.store(true); }
  bool ending() const { return ending_.load(); }

  // A new operation id, unique within the session.
  uint64_t NextOpId() { return next_op_.fetch_add(1) + 1; }

  // Registers an import of `bytes` device bytes; returns its id.
  // ResourceExhausted (naming the flag) if the session would then hold more
  // than `max_imports` imports or `max_bytes` imported bytes.
  // `wanted`: 0, or the id to give it (a client re-registering after a
  // restart; AlreadyExists if taken).
  absl::StatusOr<uint64_t> AddImport(std::shared_ptr<DeviceImport> import,
                                     uint64_t bytes, uint32_t max_imports,
                                     uint64_t max_bytes, uint64_t wanted = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps a descriptor the client passed over its session socket; returns
  // its handle (DeviceBuffer.passed_fd). ResourceExhausted beyond `max`.
  // `wanted`: 0, or the handle to give it (as AddImport's).
  absl::StatusOr<uint64_t> AddPassedFd(ScopedFd fd, uint32_t max,
                                       uint64_t wanted = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A duplicate of the descriptor of handle `handle` (the original stays
  // with the session until it ends); NotFound for an unknown handle.
  absl::StatusOr<ScopedFd> DupPassedFd(uint64_t handle) const
      ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t passed_fds() const ABSL_LOCKS_EXCLUDED(mu_);
  // Returns NotFound if the session has no import with this id.
  absl::StatusOr<std::shared_ptr<DeviceImport>> GetImport(uint64_t id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RemoveImport(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes and returns every import (session close).
  // The imports open now.
  std::vector<std::shared_ptr<DeviceImport>> Imports() const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<DeviceImport>> TakeImports()
      ABSL_LOCKS_EXCLUDED(mu_);
  // Number of imports per pool name.
  std::map<std::string, uint32_t> ImportsByPool() const ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t import_count() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const SessionId id_;
  const OwnerTag tag_;
  const std::string client_name_;
  const uint32_t pid_;
  const absl::Time opened_;
  const std::shared_ptr<SignalBoard> signals_;
  const BudgetReservation memory_;  // the signal segment's bytes
  std::atomic<uint64_t> next_op_{0};
  std::atomic<int64_t> last_active_ns_;
  std::atomic<bool> ending_{false};

  mutable absl::Mutex mu_;
  std::optional<PeerCredentials> peer_ ABSL_GUARDED_BY(mu_);
  uint64_t next_import_ ABSL_GUARDED_BY(mu_) = 0;
  struct ImportEntry {
    std::shared_ptr<DeviceImport> import;
    uint64_t bytes = 0;
  };
  absl::flat_hash_map<uint64_t, ImportEntry> imports_ ABSL_GUARDED_BY(mu_);
  uint64_t import_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_fd_handle_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, ScopedFd> passed_fds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SESSIONS_SESSION_H_
