// A churn client as its own process, for the stress and session-lifetime
// tests (which kill some of them).
//   stress_client TARGET POOL SEED SECONDS   churn, exit 0 if every byte matched
//   stress_client TARGET POOL hold TOKENS     allocate, print "ready N", sleep
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/time/time.h"
#include "hostkv/client.h"
#include "tests/e2e/churn.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: stress_client TARGET POOL SEED|hold SECONDS|TOKENS\n");
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
