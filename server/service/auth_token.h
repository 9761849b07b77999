// The shared token of --auth_token_file, checked on every call of every
// service the daemon serves.
#ifndef HOSTKV_SERVER_SERVICE_AUTH_TOKEN_H_
#define HOSTKV_SERVER_SERVICE_AUTH_TOKEN_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <string>

#include "absl/strings/string_view.h"
#include "server/operations/logging.h"

namespace hostkv {

// True if `presented` equals `expected`. The time taken depends only on
// `presented.size()` (which the caller chose), never on where the strings
// differ, on the bytes of `expected`, or on its length: there is no early
// exit.
bool ConstantTimeEquals(absl::string_view presented,
                        absl::string_view expected);

// Holds the expected token. Thread-safe.
class TokenAuthorizer {
 public:
  // An empty `token` allows every call.
  explicit TokenAuthorizer(const std::string& token);

  bool required() const { return !expected_.empty(); }

  // True if no token is required, or if `authorization` (the value of the
  // "authorization" metadata) is exactly "Bearer <token>".
  bool Matches(absl::string_view authorization) const;
  // Matches() on the call's first "authorization" metadata; false when a
  // token is required and the call carries none.
  bool Allows(const grpc::ServerContext& context) const;
  // OK if Allows(context); else UNAUTHENTICATED, and a warning naming the
  // peer (at most one per 10 s; every refusal at debug level).
  grpc::Status Check(const grpc::ServerContext& context) const;

 private:
  const std::string expected_;  // the token, or empty
  mutable WarningThrottle warnings_{absl::Seconds(10)};
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SERVICE_AUTH_TOKEN_H_
