// The HTTP endpoint that serves /metrics (--metrics_listen), with its
// token (--metrics_token_file) and hashed namespace labels.
#ifndef HOSTKV_SERVER_OPERATIONS_METRICS_ENDPOINT_H_
#define HOSTKV_SERVER_OPERATIONS_METRICS_ENDPOINT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "proto/contract/shm_segment.h"
#include "server/operations/logging.h"

namespace hostkv {

// What a page-cache namespace is labelled with on /metrics unless
// --metrics_namespace_names: the first 12 hex digits of the SHA-256 of its
// name (`printf %s NAME | sha256sum | cut -c1-12`), the same on every node
// and across restarts.
std::string NamespaceLabel(absl::string_view name_space);

// Replaces the value of every "namespace" label in `families` by
// NamespaceLabel() of it.
void HashNamespaceLabels(std::vector<prometheus::MetricFamily>& families);

struct MetricsEndpointOptions {
  std::string listen;  // HOST:PORT, [IPV6]:PORT, or PORT (every interface)
  // Called with the request's Authorization header ("" without one); false
  // answers 401. Null: every request is served.
  std::function<bool(absl::string_view authorization)> authorize;
  bool namespace_names = false;  // false: HashNamespaceLabels
};

// Serves the Prometheus text format (0.0.4) of its collectables at GET or
// HEAD /metrics over HTTP/1.x, one request per connection, on two threads of
// its own (one slow client does not hold up a scrape). A request that
// `authorize` refuses gets 401 (WWW-Authenticate: Bearer), whatever its
// path; then other methods get 405 and other paths 404. Each connection has
// 5 s for its request and the answer; a request's headers are at most 8 KiB
// (431 beyond). Thread-safe. The state the collectables read must outlive
// it: the destructor stops and joins its threads.
class MetricsEndpoint {
 public:
  // FailedPrecondition naming options.listen if it cannot listen there.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      MetricsEndpointOptions options,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }  // the port bound (PORT 0 picks one)

 private:
  MetricsEndpoint(
      MetricsEndpointOptions options,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
      ScopedFd listener, int port);

  void Serve() const;                 // one worker: accept, Answer, repeat
  void Answer(int connection) const;  // one request on a nonblocking socket
  // Reads the request up to its blank line into *head (without it); false,
  // having answered 431 if it was too long, when there is nothing to answer.
  bool ReadHead(int connection, absl::Time deadline, std::string* head) const;
  void LogRefusal(int connection, bool had_token) const;  // throttled warning
  // Waits until `fd` has `events` (POLLIN/POLLOUT); false at `deadline` or
  // once the endpoint stops.
  bool WaitFor(int fd, short events, absl::Time deadline) const;
  // Sends all of `bytes` by `deadline`, then ends the writing side; false if
  // the peer went away or was too slow.
  bool Send(int connection, absl::string_view bytes, absl::Time deadline) const;
  std::string Render() const;  // the exposition text

  // Const after construction (stop_write_ until the destructor closes it).
  // The collectables are called from both workers at once: each is
  // thread-safe (Registry, StateCollector, TierCollector are).
  const MetricsEndpointOptions options_;
  const std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  const ScopedFd listener_;  // nonblocking: both workers poll it
  const int port_;
  ScopedFd stop_read_;  // a pipe; its write end closing stops the workers
  ScopedFd stop_write_;
  std::vector<std::thread> workers_;
  mutable WarningThrottle refusals_{absl::Seconds(10)};
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_METRICS_ENDPOINT_H_
