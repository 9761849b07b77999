// A client that does random work against a pool and checks every byte it
// reads back: the load of the stress tests, in threads and in processes.
#ifndef HOSTKV_TESTS_E2E_CHURN_H_
#define HOSTKV_TESTS_E2E_CHURN_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace hostkv::testing {

struct ChurnResult {
  uint64_t operations = 0;
  uint64_t bytes_checked = 0;
  uint64_t mismatches = 0;       // bytes that did not read back as written
  uint64_t unexpected_errors = 0;
  std::string first_error;
};

// The pool every churn client uses: MHA, 2 layers, page size 16, 4096 tokens.
std::string ChurnPoolSpecText();

// Runs random alloc / backup / load / read / write / free operations on
// `pool` for `duration`, with its own device buffers, checking that what it
// wrote comes back. Pool-full errors are expected and not counted.
ChurnResult RunChurn(const std::string& target, const std::string& pool,
                     uint64_t seed, absl::Duration duration);

}  // namespace hostkv::testing

#endif  // HOSTKV_TESTS_E2E_CHURN_H_
