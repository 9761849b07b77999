#include "server/operations/byte_size.h"

#include <cctype>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace hostkv {

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  uint64_t value = 0;
  if (digits == 0 || !absl::SimpleAtoi(text.substr(0, digits), &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a size (e.g. 4096, 512MiB, 64GiB)"));
  }
  const std::string unit = absl::AsciiStrToUpper(text.substr(digits));
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1},          {"B", 1},
      {"K", 1ull << 10}, {"KIB", 1ull << 10}, {"KB", 1000},
      {"M", 1ull << 20}, {"MIB", 1ull << 20}, {"MB", 1000000},
      {"G", 1ull << 30}, {"GIB", 1ull << 30}, {"GB", 1000000000},
      {"T", 1ull << 40}, {"TIB", 1ull << 40}, {"TB", 1000000000000},
  };
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    if (value > UINT64_MAX / scale) {
      return absl::InvalidArgumentError(absl::StrCat("size '", text, "' overflows"));
    }
    return value * scale;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "': unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"));
}

}  // namespace hostkv
