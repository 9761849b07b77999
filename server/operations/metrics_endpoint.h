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

// What a page-cache namespace or a pool is labelled with on /metrics
// unless --metrics_namespace_names: the first 12 hex digits of
// HMAC-SHA256(`key`, name). Keyed, so that who does not hold the key cannot
// tell which label a name they can guess (a model's, as hostkv.vllm derives
// its names) has; with the same key (--metrics_label_key_file) the labels
// are the same on every node and across restarts, and the holder finds a
// known name's label with `printf %s NAME | openssl dgst -sha256 -hmac KEY`
// (its first 12 hex digits).
std::string HashedLabel(absl::string_view key, absl::string_view name);

// Replaces the value of every "namespace" and "pool" label in `families` by
// HashedLabel(key, value).
void HashNameLabels(absl::string_view key,
                    std::vector<prometheus::MetricFamily>& families);

struct MetricsEndpointOptions {
  std::string listen;  // HOST:PORT, [IPV6]:PORT, or PORT (every interface)
  // Called with the request's Authorization header ("" without one); false
  // answers 401. Null: every request is served.
  std::function<bool(absl::string_view authorization)> authorize;
  // false: namespaces and pools are labelled HashNameLabels(label_key).
  bool namespace_names = false;
  std::string label_key;
  // Connections open at once from one peer address; a peer's connection
  // beyond it is closed at once (--metrics_connections_per_peer).
  uint32_t connections_per_peer = 4;
};

// Serves the Prometheus text format (0.0.4) of its collectables at GET or
// HEAD /metrics over HTTP/1.x, one request per connection, on one thread of
// its own that polls every connection (an idle or slow connection holds no
// thread: it waits in poll while the others are served). A request that
// `authorize` refuses gets 401 (WWW-Authenticate: Bearer), whatever its
// path; then other methods get 405 and other paths 404. A connection has
// 2 s for its request head (at most 8 KiB; 431 beyond) and 5 s for the
// answer to be taken. At most `connections_per_peer` connections per peer
// address and kMaxConnections in all: when all are taken, the oldest one
// still without its request is closed for a new one. Thread-safe. The
// state the collectables read must outlive it: the destructor stops and
// joins its thread.
class MetricsEndpoint {
 public:
  // Connections open at once, all peers together.
  static constexpr size_t kMaxConnections = 128;

  // FailedPrecondition naming options.listen if it cannot listen there.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      MetricsEndpointOptions options,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }  // the port bound (PORT 0 picks one)

 private:
  // One accepted connection: reading its head, then writing its answer.
  struct Connection {
    ScopedFd fd;
    std::string peer;  // the address, without the port
    absl::Time accepted;
    absl::Time deadline;
    std::string head;  // read so far
    std::string out;   // the answer; empty while reading
    size_t sent = 0;
    bool done = false;  // to be closed
  };

  MetricsEndpoint(
      MetricsEndpointOptions options,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
      ScopedFd listener, int port);

  void Loop();  // the thread: poll, accept, read, answer, expire
  // Accepts the connections waiting (a few per round), within the bounds.
  void AcceptSome();
  // Reads what `c` sent; once its head is complete, makes its answer.
  void ReadFrom(Connection& c);
  // Sends what it can of `c`'s answer; done when all is sent.
  void WriteTo(Connection& c);
  // The answer to request head `head` (without its blank line).
  std::string AnswerTo(const Connection& c, absl::string_view head) const;
  void LogRefusal(const Connection& c, bool had_token) const;  // throttled
  std::string Render() const;  // the exposition text

  // Const after construction.
  const MetricsEndpointOptions options_;
  const std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  const ScopedFd listener_;  // nonblocking
  const int port_;
  ScopedFd stop_read_;  // a pipe; its write end closing stops the thread
  ScopedFd stop_write_;
  // The thread's own.
  std::vector<Connection> connections_;
  absl::Time accept_paused_until_;  // after EMFILE/ENFILE
  std::thread thread_;
  mutable WarningThrottle refusals_{absl::Seconds(10)};
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_METRICS_ENDPOINT_H_
