// Daemons ("nodes") that share one storage tier, each with the same pool and
// an engine session of its own: what the e2e tier tests drive. A page's
// bytes depend only on its key (PageData), so any page a lookup returns can
// be checked, wherever it came from.
#ifndef HOSTKV_TESTS_E2E_TIER_NODES_H_
#define HOSTKV_TESTS_E2E_TIER_NODES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hostkv/client.h"
#include "tests/testing/daemon_process.h"

namespace hostkv::testing {

inline constexpr char kTierPool[] = "tiered";
inline constexpr char kTierNamespace[] = "model-a/tp0";
// How long a test waits for what happens in the background (write-behind,
// a health entry flipping): far more than it takes.
inline constexpr absl::Duration kSettle = absl::Seconds(20);

// The bytes of the page published under `key`.
std::string PageData(const std::string& key, uint64_t page_bytes);
// prefix-00, prefix-01, ...: n keys of one chain.
std::vector<std::string> ChainKeys(const std::string& prefix, int n);

// One hostkvd with --tier=`tier_url`, the pool kTierPool (every node
// creates the same one) and an engine session on it.
class TierNode {
 public:
  TierNode(const std::string& tier_url,
           std::vector<std::string> extra_args = {});

  // Started, connected, pool created; else why not in error().
  bool ready() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  std::string log() const { return daemon_.log(); }
  const std::string& target() const { return daemon_.target(); }
  Client& engine() { return *engine_; }
  uint64_t page_bytes() const { return page_bytes_; }

  // Allocates a page per key, writes PageData(key) into it and publishes
  // the keys as one chain (each the parent of the next). Error if a call
  // fails or a key was not newly cached.
  absl::Status PublishChain(const std::vector<std::string>& keys);
  // Looks `keys` up with acquire, reads the pages found, checks each
  // against PageData of its key and releases them. Returns the hits;
  // DataLoss if a page's bytes differ.
  absl::StatusOr<uint64_t> LookupAndCheck(const std::vector<std::string>& keys);
  // Alloc then Free of one page: a host operation that never needs the
  // tier.
  absl::Status AllocAndFree();

  // GetPoolStats' tier field (default-valued if the call fails).
  v1::TierStats Tier();
  // Polls until tier.written reaches n; false after kSettle.
  bool WaitWritten(uint64_t n);
  // Polls the health entry "hostkv.tier" until it is SERVING (or not).
  bool WaitTierHealth(bool serving);
  // Polls the daemon's log until it contains `text`.
  bool WaitLog(const std::string& text);

 private:
  DaemonProcess daemon_;
  std::unique_ptr<Client> engine_;
  uint64_t page_bytes_ = 0;
  std::string error_;
};

// Polls `done` every 20 ms until it is true or kSettle has passed.
template <typename Done>
bool PollUntil(Done done) {
  const absl::Time deadline = absl::Now() + kSettle;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

}  // namespace hostkv::testing

#endif  // HOSTKV_TESTS_E2E_TIER_NODES_H_
