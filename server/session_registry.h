// Open sessions by id.
#ifndef HOSTKV_SERVER_SESSION_REGISTRY_H_
#define HOSTKV_SERVER_SESSION_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/session.h"

namespace hostkv {

// Thread-safe. Session ids are random 64-bit numbers, so that one client
// cannot guess another's.
class SessionRegistry {
 public:
  // Signal segments are named "<segment_prefix>signals.<id>".
  SessionRegistry(std::string segment_prefix, uint32_t signal_records);

  absl::StatusOr<std::shared_ptr<Session>> Open(const std::string& client_name,
                                                uint32_t pid)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Returns NotFound for an unknown (or already closed) session. Counts as
  // activity of the session (Session::Touch).
  absl::StatusOr<std::shared_ptr<Session>> Get(uint64_t id) const
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
  absl::StatusOr<std::shared_ptr<Session>> Remove(uint64_t id)
      ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<std::shared_ptr<Session>> List() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string segment_prefix_;
  const uint32_t signal_records_;

  mutable absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  OwnerTag next_tag_ ABSL_GUARDED_BY(mu_) = kNoOwner;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Session>> sessions_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SESSION_REGISTRY_H_
