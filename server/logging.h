// spdlog set-up for hostkvd: text lines for people, JSON lines for log
// collectors.
#ifndef HOSTKV_SERVER_LOGGING_H_
#define HOSTKV_SERVER_LOGGING_H_

#include <string>

#include "absl/status/status.h"

namespace hostkv {

// `level`: trace, debug, info, warn, error, off. `format`: text or json
// (one object per line: time, level, msg). InvalidArgument naming the bad
// value otherwise.
absl::Status SetUpLogging(const std::string& level, const std::string& format);

// `text` escaped for a JSON string.
std::string JsonEscape(const std::string& text);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_LOGGING_H_
