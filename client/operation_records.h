// The loads and backups a client submitted, by the signal segment of the
// daemon that answered each (TransferResponse.signal_segment_id): an
// operation is waited for in its own daemon's records and nowhere else, and
// when the session resumes with a restarted daemon, each one the previous
// daemon had not finished is submitted again (server/README.md "While
// hostkvd is away"). Private to client/.
#ifndef HOSTKV_CLIENT_OPERATION_RECORDS_H_
#define HOSTKV_CLIENT_OPERATION_RECORDS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "hostkv/client.h"
#include "hostkv/v1/hostkv.pb.h"
#include "proto/contract/shm_segment.h"

namespace hostkv {

// A session's signal segment: its records, mapped read-only.
struct SignalRecords {
  uint64_t id = 0;  // TransferResponse.signal_segment_id
  ShmSegment segment;
  uint32_t slots = 0;
};

// A submission kept until known finished: what to send again.
struct SubmittedOp {
  Operation op;
  bool load = false;
  std::shared_ptr<const v1::TransferRequest> request;
};

// Thread-safe.
class OperationRecords {
 public:
  // Makes `records` the current segment (kept mapped with the earlier ones).
  // A daemon that sends no segment id (0) gets one made up here.
  void UseSegment(SignalRecords records) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t current() const ABSL_LOCKS_EXCLUDED(mu_);
  // The segment with id `id` (0: the current one), or null.
  std::shared_ptr<const SignalRecords> Segment(uint64_t id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Keeps `op` until Ended() says it is finished (checked for the oldest
  // once many are kept).
  void Track(SubmittedOp op) ABSL_LOCKS_EXCLUDED(mu_);
  // Every operation kept, forgotten here (a resume decides their fate).
  std::vector<SubmittedOp> TakeOutstanding() ABSL_LOCKS_EXCLUDED(mu_);

  // What a resume submitted again for `op`: the new operation, or the
  // error its submission got; nullopt if nothing was.
  std::optional<absl::StatusOr<Operation>> Replacement(
      const Operation& op) const ABSL_LOCKS_EXCLUDED(mu_);
  void Replace(const Operation& op, absl::StatusOr<Operation> replacement)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Whether `op` finished (or was abandoned) in its own daemon's records,
  // its first `layers` layers (0: all), without waiting.
  bool Ended(const Operation& op, uint32_t layers = 0) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Key = std::pair<uint64_t, uint64_t>;  // (segment, op_id)
  static Key KeyOf(const Operation& op) {
    return {op.signal_segment, op.op_id};
  }

  mutable absl::Mutex mu_;
  uint64_t current_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t made_up_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::shared_ptr<const SignalRecords>> segments_
      ABSL_GUARDED_BY(mu_);
  std::map<Key, SubmittedOp> outstanding_ ABSL_GUARDED_BY(mu_);
  std::map<Key, absl::StatusOr<Operation>> replacements_ ABSL_GUARDED_BY(mu_);
  std::vector<Key> replacement_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_OPERATION_RECORDS_H_
