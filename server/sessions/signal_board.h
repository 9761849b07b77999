// A session's per-operation completion records (OpSignal) in shared memory,
// and which of them are in use.
#ifndef HOSTKV_SERVER_SESSIONS_SIGNAL_BOARD_H_
#define HOSTKV_SERVER_SESSIONS_SIGNAL_BOARD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/contract/op_signal.h"
#include "proto/contract/shm_segment.h"

namespace hostkv {

// Thread-safe. Shared by a session and its operations in flight, so it
// outlives a session that closes while copies still run.
class SignalBoard {
 public:
  // Creates segment `name` with `records` OpSignal records.
  static absl::StatusOr<std::shared_ptr<SignalBoard>> Create(
      const std::string& name, uint32_t records);

  // The segment's name; empty once RemoveName ran.
  std::string name() const ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t records() const { return records_; }
  // A random non-zero id of this segment (TransferResponse.signal_segment_id):
  // a session resumed by a restarted daemon gets a new segment with another.
  uint64_t id() const { return id_; }

  // A read-only descriptor of the segment (for the session socket), then
  // the name is removed: from then on only holders of a descriptor can map
  // it. FailedPrecondition if the name is gone already.
  absl::StatusOr<ScopedFd> TakeReadOnlyFd() ABSL_LOCKS_EXCLUDED(mu_);

  // Claims a free record for op_id and resets it (no layers done). Returns
  // ResourceExhausted when every record belongs to an operation in flight,
  // Unavailable once the board is cancelled.
  absl::StatusOr<uint32_t> Claim(uint64_t op_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Publishes progress of the operation in record `index`.
  void Publish(uint32_t index, uint32_t layers_done);

  // Ends the operation in record `index` (after its last Publish, or with a
  // failure mark) and makes the record reusable.
  void Finish(uint32_t index, bool failed) ABSL_LOCKS_EXCLUDED(mu_);

  // No further claims; operations in flight should stop at the next layer.
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until no record is in use.
  void AwaitIdle() ABSL_LOCKS_EXCLUDED(mu_);

  uint32_t in_flight() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  SignalBoard(ShmSegment segment, uint32_t records);
  OpSignal& record(uint32_t index) const {
    return reinterpret_cast<OpSignal*>(segment_.data())[index];
  }

  ShmSegment segment_;  // mapping fixed after Create; the name under mu_
  const uint32_t records_;
  const uint64_t id_;

  mutable absl::Mutex mu_;
  bool named_ ABSL_GUARDED_BY(mu_) = true;
  std::vector<bool> busy_ ABSL_GUARDED_BY(mu_);
  uint32_t next_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SESSIONS_SIGNAL_BOARD_H_
