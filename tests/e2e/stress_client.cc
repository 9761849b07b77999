// A churn client as its own process, for the stress and session-lifetime
// tests (which kill some of them).
//   stress_client TARGET POOL SEED SECONDS   churn, exit 0 if every byte matched
//   stress_client TARGET POOL hold TOKENS     allocate, print "ready N", sleep
//   stress_client TARGET POOL cache SEED SECONDS
//                                             page cache churn (publish,
//                                             lookup, load, copy, release,
//                                             evicting allocations), exit 0
//                                             if every loaded byte was the
//                                             published one
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/time/time.h"
#include "hostkv/client.h"
#include "tests/e2e/cache_churn.h"
#include "tests/e2e/churn.h"

namespace {

int RunCache(const std::string& target, const std::string& pool,
             uint64_t seed, int seconds) {
  const hostkv::testing::CacheChurnResult r = hostkv::testing::RunCacheChurn(
      target, pool, seed, absl::Seconds(seconds));
  std::printf(
      "operations=%llu bytes_checked=%llu mismatches=%llu errors=%llu "
      "published=%llu already_cached=%llu hits=%llu copied=%llu "
      "pressure_allocs=%llu %s\n",
      static_cast<unsigned long long>(r.churn.operations),
      static_cast<unsigned long long>(r.churn.bytes_checked),
      static_cast<unsigned long long>(r.churn.mismatches),
      static_cast<unsigned long long>(r.churn.unexpected_errors),
      static_cast<unsigned long long>(r.pages_published),
      static_cast<unsigned long long>(r.already_cached),
      static_cast<unsigned long long>(r.hits),
      static_cast<unsigned long long>(r.pages_copied),
      static_cast<unsigned long long>(r.pressure_allocs),
      r.churn.first_error.c_str());
  return r.churn.mismatches == 0 && r.churn.unexpected_errors == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 6 && std::string(argv[3]) == "cache") {
    return RunCache(argv[1], argv[2], std::strtoull(argv[4], nullptr, 10),
                    std::atoi(argv[5]));
  }
  if (argc != 5) {
    std::fprintf(stderr,
                 "usage: stress_client TARGET POOL SEED|hold SECONDS|TOKENS\n"
                 "       stress_client TARGET POOL cache SEED SECONDS\n");
    return 2;
  }
  const std::string target = argv[1], pool = argv[2], mode = argv[3];
  if (mode == "hold") {
    auto client = hostkv::Client::Connect(target, "holder");
    if (!client.ok()) return 3;
    auto pages = (*client)->Alloc(pool, std::strtoull(argv[4], nullptr, 10));
    if (!pages.ok()) return 4;
    std::printf("ready %u\n", (*client)->session_number());
    std::fflush(stdout);
    while (true) pause();
  }
  const hostkv::testing::ChurnResult r = hostkv::testing::RunChurn(
      target, pool, std::strtoull(argv[3], nullptr, 10),
      absl::Seconds(std::atoi(argv[4])));
  std::printf("operations=%llu bytes_checked=%llu mismatches=%llu errors=%llu %s\n",
              static_cast<unsigned long long>(r.operations),
              static_cast<unsigned long long>(r.bytes_checked),
              static_cast<unsigned long long>(r.mismatches),
              static_cast<unsigned long long>(r.unexpected_errors),
              r.first_error.c_str());
  return r.mismatches == 0 && r.unexpected_errors == 0 ? 0 : 1;
}
