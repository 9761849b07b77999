// Ends sessions off the session monitor's thread: ending one waits for its
// running copy (and, on the GPU, for its import's operations), which must
// not hold up other clients' attaches. Also expires idle unattached
// sessions.
#ifndef HOSTKV_SERVER_SESSIONS_SESSION_REAPER_H_
#define HOSTKV_SERVER_SESSIONS_SESSION_REAPER_H_

#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/service/request_handler.h"

namespace hostkv {

// Thread-safe. One thread; the destructor ends the sessions still queued,
// then joins it.
class SessionReaper {
 public:
  // Expires unattached sessions idle for longer than `lease`, every second.
  SessionReaper(RequestHandler* handler, absl::Duration lease);
  ~SessionReaper() ABSL_LOCKS_EXCLUDED(mu_);

  // Ends session `id` soon (RequestHandler::EndSession with `reason`).
  void End(SessionId id, const char* reason) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  RequestHandler* const handler_;
  const absl::Duration lease_;

  absl::Mutex mu_;
  std::deque<std::pair<SessionId, const char*>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SESSIONS_SESSION_REAPER_H_
