// spdlog set-up for hostkvd: text lines for people, JSON lines for log
// collectors.
#ifndef HOSTKV_SERVER_OPERATIONS_LOGGING_H_
#define HOSTKV_SERVER_OPERATIONS_LOGGING_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hostkv {

// `level`: trace, debug, info, warn, error, off. `format`: text or json
// (one object per line: time, level, msg). InvalidArgument naming the bad
// value otherwise.
absl::Status SetUpLogging(const std::string& level, const std::string& format);

// `text` escaped for a JSON string.
std::string JsonEscape(const std::string& text);

// `text` with its control characters escaped (\n, \r, \t, \xNN): what the
// text log prints of a message, so that no client-supplied string in it
// (client_name, namespace, a status message quoting them) starts a line.
std::string LogEscape(absl::string_view text);

// Keeps a warning that a client can trigger at will (a refused token, a
// refused stream) from flooding the log: one per `period`. Thread-safe.
class WarningThrottle {
 public:
  explicit WarningThrottle(absl::Duration period) : period_(period) {}

  // True if a warning may be logged now; then *held_back is the number of
  // warnings refused since the last one allowed.
  bool Allow(uint64_t* held_back) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const absl::Duration period_;
  absl::Mutex mu_;
  absl::Time next_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t held_back_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_LOGGING_H_
