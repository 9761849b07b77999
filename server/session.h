// One connected client: its identity, its completion records and the device
// buffers it registered. Its slots live in the pools' allocators under
// tag().
#ifndef HOSTKV_SERVER_SESSION_H_
#define HOSTKV_SERVER_SESSION_H_

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
#include "server/device_import.h"
#include "server/signal_board.h"
#include "server/slot_allocator.h"

namespace hostkv {

// Who is at the other end of a session's attached Unix socket (SO_PEERCRED).
struct PeerCredentials {
  uint32_t pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
};

// Thread-safe.
class Session {
 public:
  Session(uint64_t id, OwnerTag tag, std::string client_name, uint32_t pid,
          std::shared_ptr<SignalBoard> signals);

  // The secret the client names the session by.
  uint64_t id() const { return id_; }
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
  // one is attached already.
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

  // Registers an import; returns its id.
  uint64_t AddImport(std::shared_ptr<DeviceImport> import)
      ABSL_LOCKS_EXCLUDED(mu_);
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

 private:
  const uint64_t id_;
  const OwnerTag tag_;
  const std::string client_name_;
  const uint32_t pid_;
  const absl::Time opened_;
  const std::shared_ptr<SignalBoard> signals_;
  std::atomic<uint64_t> next_op_{0};
  std::atomic<int64_t> last_active_ns_;
  std::atomic<bool> ending_{false};

  mutable absl::Mutex mu_;
  std::optional<PeerCredentials> peer_ ABSL_GUARDED_BY(mu_);
  uint64_t next_import_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::shared_ptr<DeviceImport>> imports_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SESSION_H_
