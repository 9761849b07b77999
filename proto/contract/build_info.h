// What a binary of hostkv is: its version, the commit it was built from, and
// its build type, for `hostkvd --version` and `hostkv --version`.
#ifndef HOSTKV_PROTO_CONTRACT_BUILD_INFO_H_
#define HOSTKV_PROTO_CONTRACT_BUILD_INFO_H_

#include <string>

#include "absl/strings/string_view.h"

namespace hostkv {

// "<program> 0.1.0 (commit 1a2b3c4d5e6f, RelWithDebInfo build)".
std::string BuildInfo(absl::string_view program);

}  // namespace hostkv

#endif  // HOSTKV_PROTO_CONTRACT_BUILD_INFO_H_
