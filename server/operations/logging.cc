#include "server/operations/logging.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

// A pattern flag printing the message through `Escape`: %* for JSON
// (JsonEscape), %& for text (LogEscape: a client's string cannot start a
// line).
template <std::string (*Escape)(absl::string_view)>
class EscapedMessageFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string escaped =
        Escape(absl::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(escaped.data(), escaped.data() + escaped.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<EscapedMessageFlag>();
  }
};

std::string JsonEscapeView(absl::string_view text) {
  return JsonEscape(std::string(text));
}

}  // namespace

std::string LogEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += absl::StrFormat("\\x%02x", u);
    } else {
      out += c;
    }
  }
  return out;
}

bool WarningThrottle::Allow(uint64_t* held_back) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (now < next_) {
    ++held_back_;
    return false;
  }
  next_ = now + period_;
  *held_back = held_back_;
  held_back_ = 0;
  return true;
}

std::string JsonEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out;
}

absl::Status SetUpLogging(const std::string& level, const std::string& format) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log_level: unknown level '", level,
        "' (trace, debug, info, warn, error, off)"));
  }
  spdlog::set_level(parsed);
  if (format == "json") {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<EscapedMessageFlag<JsonEscapeView>>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%f%z","level":"%l","msg":"%*"})");
    spdlog::set_formatter(std::move(formatter));
  } else if (format == "text") {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<EscapedMessageFlag<LogEscape>>('&').set_pattern(
        "[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %&");
    spdlog::set_formatter(std::move(formatter));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_format: '", format, "' is not text or json"));
  }
  return absl::OkStatus();
}

}  // namespace hostkv
