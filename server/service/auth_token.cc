#include "server/service/auth_token.h"

#include <cstddef>

#include "absl/strings/match.h"
#include "spdlog/spdlog.h"

namespace hostkv {

bool ConstantTimeEquals(absl::string_view presented,
                        absl::string_view expected) {
  if (expected.empty()) return presented.empty();  // nothing secret to hide
  // Every presented byte is compared with a byte of `expected` (cycling
  // through it when `presented` is longer), so the loop runs
  // presented.size() times whatever either string holds. The volatile
  // accumulator keeps the compiler from turning the loop into an early exit.
  volatile unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  const size_t n = expected.size();
  for (size_t i = 0; i < presented.size(); ++i) {
    diff = diff | static_cast<unsigned char>(presented[i] ^ expected[i % n]);
  }
  return diff == 0;
}

TokenAuthorizer::TokenAuthorizer(const std::string& token) : expected_(token) {}

bool TokenAuthorizer::Matches(absl::string_view authorization) const {
  if (!required()) return true;
  // "Bearer <token>": the scheme is case-insensitive (RFC 7235 section 2.1,
  // RFC 6750), the token is compared in constant time.
  constexpr absl::string_view kScheme = "bearer ";
  const bool scheme = authorization.size() >= kScheme.size() &&
                      absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()),
                                             kScheme);
  const absl::string_view token =
      scheme ? authorization.substr(kScheme.size()) : absl::string_view();
  return ConstantTimeEquals(token, expected_) && scheme;
}

bool TokenAuthorizer::Allows(const grpc::ServerContext& context) const {
  if (!required()) return true;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return false;
  return Matches(absl::string_view(it->second.data(), it->second.size()));
}

grpc::Status TokenAuthorizer::Check(const grpc::ServerContext& context) const {
  if (Allows(context)) return grpc::Status::OK;
  spdlog::debug("refused a call from {}: missing or wrong token",
                context.peer());
  if (uint64_t held_back = 0; warnings_.Allow(&held_back)) {
    spdlog::warn(
        "refused a call from {}: missing or wrong token ({} more "
        "refused calls not logged)",
        context.peer(), held_back);
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "this daemon requires 'authorization: Bearer <token>'");
}

}  // namespace hostkv
