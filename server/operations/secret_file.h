// Secret files the daemon reads at start (--auth_token_file,
// --tier_password_file, --metrics_token_file).
#ifndef HOSTKV_SERVER_OPERATIONS_SECRET_FILE_H_
#define HOSTKV_SERVER_OPERATIONS_SECRET_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hostkv {

// The first line of the secret file `path` that the flag `--<flag>` names
// (`what`: "a token", "a password"). Refuses, with InvalidArgument naming
// the file, its mode in octal and the chmod that fixes it, a file that other
// users may read or write (mode & 0006) or that is not a regular file; group
// access is allowed (Kubernetes mounts Secrets group-readable for the pod's
// fsGroup). The mode checked is the opened file's (fstat on the descriptor
// that is read), so a symlink such as a Secret's ..data link is judged by
// what it points at, and nothing can swap the file between check and read.
// InvalidArgument also when it cannot be opened or its first line is empty.
absl::StatusOr<std::string> ReadSecretFile(absl::string_view flag,
                                           const std::string& path,
                                           absl::string_view what);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_SECRET_FILE_H_
