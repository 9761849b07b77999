// The daemon-wide ledger: the sessions (so that engines resume them after a
// restart) and the namespaces' owners (so that cached keys stay their
// owners'). One memfd, held by the state keeper beside the pools' ledgers
// (pool_ledger.h). Fixed slots, each checksummed: a record torn by a crash
// or flipped is unproven and left out, never trusted.
#ifndef HOSTKV_SERVER_STATE_DAEMON_LEDGER_H_
#define HOSTKV_SERVER_STATE_DAEMON_LEDGER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/contract/shm_segment.h"
#include "server/cache/namespace_owners.h"
#include "server/pool/slot_allocator.h"

namespace hostkv {

// A session as the ledger keeps it: never its secret, only its SHA-256.
struct SessionRecord {
  OwnerTag tag = 0;
  bool verified = false;  // uid/gid/pid from an attached session socket
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t pid = 0;
  int64_t opened_unix_ns = 0;
  std::string secret_sha256;  // 32 bytes
  std::string client_name;    // at most 200 bytes
};

struct NamespaceRecord {
  std::string name;
  NamespaceOwner owner;
};

// Thread-safe.
class DaemonLedger {
 public:
  // A new, empty ledger with room for `session_slots` sessions and
  // `namespace_slots` namespaces; `generation` counts the restarts adopted.
  static absl::StatusOr<std::unique_ptr<DaemonLedger>> Create(
      uint32_t session_slots, uint32_t namespace_slots, uint64_t generation);
  // Maps the ledger behind `fd`; FailedPrecondition naming what is wrong.
  static absl::StatusOr<std::unique_ptr<DaemonLedger>> Open(ScopedFd fd);

  int fd() const { return segment_.fd(); }
  uint64_t generation() const { return generation_; }

  struct Contents {
    std::vector<SessionRecord> sessions;
    std::vector<NamespaceRecord> namespaces;
    uint64_t unproven = 0;  // records torn or flipped
  };
  Contents Read() const ABSL_LOCKS_EXCLUDED(mu_);

  // Writes (or rewrites) the record of session `record.tag`. False, with a
  // warning logged once, when every slot is taken (that session will not
  // survive a restart).
  bool RecordSession(const SessionRecord& record) ABSL_LOCKS_EXCLUDED(mu_);
  void EraseSession(OwnerTag tag) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes a namespace's owner; false, with a warning, when every slot is
  // taken.
  bool RecordNamespace(const NamespaceRecord& record) ABSL_LOCKS_EXCLUDED(mu_);
  // Frees the slot of a claim given back (NamespaceOwners::ReleaseUnused).
  void EraseNamespace(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t namespaces_recorded() const ABSL_LOCKS_EXCLUDED(mu_);

  static uint64_t Layout();

 private:
  struct Header;
  struct SessionSlot;
  struct NamespaceSlot;
  DaemonLedger(ShmSegment segment, uint32_t session_slots,
               uint32_t namespace_slots, uint64_t generation);
  SessionSlot* Sessions() const;
  NamespaceSlot* Namespaces() const;
  static uint64_t BytesFor(uint64_t session_slots, uint64_t namespace_slots);

  ShmSegment segment_;
  const uint32_t session_slots_;
  const uint32_t namespace_slots_;
  const uint64_t generation_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<OwnerTag, uint32_t> slot_of_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_slots_ ABSL_GUARDED_BY(mu_);
  uint32_t namespaces_used_ ABSL_GUARDED_BY(mu_) = 0;  // slots ever written
  absl::flat_hash_map<std::string, uint32_t> namespace_slot_of_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_namespace_slots_ ABSL_GUARDED_BY(mu_);
  bool warned_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_STATE_DAEMON_LEDGER_H_
