// At start: what the hostkvd before this one left with the state keeper,
// checked and adopted (deploy/README.md "Restarts and upgrades"), and the ledgers
// this daemon writes from then on.
#ifndef HOSTKV_SERVER_STATE_STATE_ADOPTION_H_
#define HOSTKV_SERVER_STATE_STATE_ADOPTION_H_

#include <memory>

#include "absl/status/statusor.h"
#include "server/operations/daemon_metrics.h"
#include "server/pool/pool_registry.h"
#include "server/sessions/session_registry.h"
#include "server/state/daemon_ledger.h"
#include "server/state/state_keeper.h"

namespace hostkv {

struct AdoptedState {
  std::unique_ptr<DaemonLedger> ledger;  // this daemon's, deposited
  DaemonMetrics::Adoption counts;
  uint64_t generation = 0;  // restarts adopted so far, this one included
  bool adopted = false;     // a previous daemon's state was found
  absl::Duration duration;  // collecting, checking and adopting it
};

// Collects the keeper's descriptors; adopts the sessions, namespace owners
// and pools they describe into `sessions` and `pools` (which must be empty);
// installs a new daemon ledger and the keeper for every later change.
// FailedPrecondition, naming the ledger and saying to start with
// --discard_state, for a state this build cannot read (another format,
// truncated, a bad header) or whose pools no longer fit (budget).
absl::StatusOr<AdoptedState> AdoptState(StateKeeper& keeper,
                                        uint32_t max_sessions,
                                        PoolRegistry& pools,
                                        SessionRegistry& sessions);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_STATE_STATE_ADOPTION_H_
