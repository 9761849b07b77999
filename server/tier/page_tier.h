// A storage tier under the page cache (server/README.md, "Storage tiers"): pages in
// SGLang's flat page format, framed by tier_value.h, addressed by
// (namespace, key) on a store outside the daemon's host memory: Redis
// (standalone or Cluster) or files on a local or distributed filesystem.
// The page cache decides what goes there and when; a tier only stores.
#ifndef HOSTKV_SERVER_TIER_PAGE_TIER_H_
#define HOSTKV_SERVER_TIER_PAGE_TIER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace hostkv {

// What a tier stores a value under: the page cache's namespace and key
// (opaque bytes; a tier encodes them as its store needs, e.g. hex in file
// names).
struct TierKey {
  std::string name_space;
  std::string key;
};

// Thread-safe: the daemon calls a tier from several threads at once.
// Every call is bounded in time by the tier's own timeouts: a store that is
// down or slow answers Unavailable or DeadlineExceeded, never blocks for
// long. Batches are all sent at once (pipelined) where the store allows.
class PageTier {
 public:
  virtual ~PageTier() = default;

  // For logs and stats: "redis://host:port", "file:/path".
  virtual std::string Describe() const = 0;

  // Stores values[i] under keys[i] (replacing what is there); one status
  // per item. REQUIRES: keys.size() == values.size().
  virtual std::vector<absl::Status> Put(
      absl::Span<const TierKey> keys,
      absl::Span<const absl::string_view> values) = 0;

  // The value under each key: NotFound if there is none; Unavailable /
  // DeadlineExceeded if the store did not answer. The value is returned as
  // stored (the caller checks its frame).
  virtual std::vector<absl::StatusOr<std::string>> Get(
      absl::Span<const TierKey> keys) = 0;

  // How many keys, from the first, have a value (one batched round trip
  // where the store allows).
  virtual absl::StatusOr<uint64_t> CountPrefix(
      absl::Span<const TierKey> keys) = 0;

  // Removes the values under keys (absent ones are fine).
  virtual absl::Status Delete(absl::Span<const TierKey> keys) = 0;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_PAGE_TIER_H_
