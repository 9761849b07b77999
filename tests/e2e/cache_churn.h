// A client that works the page cache of the churn pool at random: publishes
// pages it backed up, looks them up (with and without acquire), loads them,
// copies them into pages of its own, releases them, and allocates large
// blocks that force evictions. Every byte it loads is checked against what
// any publisher of that key wrote: a key's content is a function of the key.
#ifndef HOSTKV_TESTS_E2E_CACHE_CHURN_H_
#define HOSTKV_TESTS_E2E_CACHE_CHURN_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "tests/e2e/churn.h"

namespace hostkv::testing {

// The namespace every cache churner publishes in.
inline constexpr char kCacheChurnNamespace[] = "stress/churn-pool";

struct CacheChurnResult {
  ChurnResult churn;  // operations, bytes checked, mismatches, errors
  uint64_t pages_published = 0;  // PUBLISH_CACHED items
  uint64_t already_cached = 0;   // PUBLISH_ALREADY_CACHED items
  uint64_t hits = 0;             // keys found by Lookup with acquire
  uint64_t pages_copied = 0;     // by CopyPages
  uint64_t pressure_allocs = 0;  // large allocations that succeeded
};

// Runs the cache work on `pool` (the churn pool, ChurnPoolSpecText) for
// `duration`. Pool-full errors are expected and not counted; any other error,
// or an outcome or count the proto does not allow, is.
CacheChurnResult RunCacheChurn(const std::string& target,
                               const std::string& pool, uint64_t seed,
                               absl::Duration duration);

}  // namespace hostkv::testing

#endif  // HOSTKV_TESTS_E2E_CACHE_CHURN_H_
