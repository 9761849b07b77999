// A test hook: with HOSTKVD_CRASH_AT=<point>[:<n>] in its environment, the
// daemon SIGKILLs itself the n-th time (default: the first) it passes
// CrashPoint(<point>), to test that what a crash there leaves is adopted
// consistently (tests/python/test_restart_crash_points.py). Points:
//   publish       pages moved to the cache, no key recorded yet
//   publish_item  one key of a publish recorded, the next not yet
//   scrub         freed pages zeroed, the ledger not yet told
//   evict         a key's record erased, its page not yet freed
// Without the variable each call costs one load and a compare.
#ifndef HOSTKV_SERVER_OPERATIONS_CRASH_POINT_H_
#define HOSTKV_SERVER_OPERATIONS_CRASH_POINT_H_

#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace hostkv {

struct CrashPlan {
  std::string point;
  long at = 1;
  std::atomic<long> passed{0};
};

inline CrashPlan* TheCrashPlan() {
  static CrashPlan* plan = []() -> CrashPlan* {
    const char* value = std::getenv("HOSTKVD_CRASH_AT");
    if (value == nullptr || *value == '\0') return nullptr;
    auto* p = new CrashPlan;
    const char* colon = std::strchr(value, ':');
    p->point = colon == nullptr ? std::string(value) : std::string(value, colon);
    if (colon != nullptr) p->at = std::max(1L, std::strtol(colon + 1, nullptr, 10));
    return p;
  }();
  return plan;
}

inline void CrashPoint(const char* point) {
  CrashPlan* plan = TheCrashPlan();
  if (plan == nullptr || plan->point != point) return;
  if (plan->passed.fetch_add(1) + 1 == plan->at) raise(SIGKILL);
}

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_CRASH_POINT_H_
