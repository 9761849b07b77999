#include "server/pool/reserved_names.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/pool/pool_access.h"

namespace hostkv {

std::optional<uint32_t> ReservedUid(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "uid")) return std::nullopt;
  const size_t dot = name.find('.');
  if (dot == absl::string_view::npos || dot == 0 || dot > 10) return std::nullopt;
  const absl::string_view digits = name.substr(0, dot);
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  uint32_t uid = 0;
  if (!absl::SimpleAtoi(digits, &uid)) return std::nullopt;
  return uid;
}

absl::Status CheckReservedName(absl::string_view what, absl::string_view name,
                               const Principal& who) {
  const std::optional<uint32_t> uid = ReservedUid(name);
  if (!uid.has_value()) return absl::OkStatus();
  if (who.peer.has_value() && who.peer->uid == *uid) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      what, " '", name, "' is reserved to uid ", *uid,
      " (names that begin with \"uid<N>.\" are user N's); this session is ",
      who.peer.has_value() ? absl::StrCat("uid ", who.peer->uid)
                           : std::string("unverified (no session socket)")));
}

}  // namespace hostkv
