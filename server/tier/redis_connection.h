// One connection to a Redis server (hiredis), used by one thread at a time,
// and the pipelined round trip the Redis tier makes on it.
#ifndef HOSTKV_SERVER_TIER_REDIS_CONNECTION_H_
#define HOSTKV_SERVER_TIER_REDIS_CONNECTION_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

struct redisContext;
struct redisReply;

namespace hostkv {

// Where a Redis server listens: "host:port" or "unix:/path".
struct RedisAddress {
  std::string host;  // empty for a Unix socket
  int port = 0;
  std::string unix_path;

  // Returns InvalidArgument for anything else.
  static absl::StatusOr<RedisAddress> Parse(absl::string_view address);
  // "redis://host:port" or "redis+unix:/path".
  std::string Describe() const;
};

// One reply of a pipeline, owned (freeReplyObject on destruction).
struct RedisReplyDeleter {
  void operator()(redisReply* reply) const;
};
using RedisReplyPtr = std::unique_ptr<redisReply, RedisReplyDeleter>;

// One command: its arguments, binary-safe (views into the caller's bytes,
// which must outlive the Pipeline call).
using RedisCommand = std::vector<absl::string_view>;

// Owns a redisContext. Not thread-safe: one thread at a time (the tier's
// pool checks it out). Once a call failed on the socket, broken() is true
// and the connection must be dropped.
class RedisConnection {
 public:
  // Connects within connect_timeout, sets call_timeout on the socket (each
  // read and write), and sends AUTH when password is not empty.
  // Returns Unavailable if the server cannot be reached, DeadlineExceeded if
  // it did not answer in time, Unauthenticated if AUTH was refused.
  static absl::StatusOr<std::unique_ptr<RedisConnection>> Open(
      const RedisAddress& address, const std::string& password,
      absl::Duration connect_timeout, absl::Duration call_timeout);

  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends every command, then reads every reply: one round trip. Returns one
  // reply per command, or, for the commands whose reply never came, the
  // socket's error (Unavailable; DeadlineExceeded on a timeout); the
  // connection is then broken().
  std::vector<absl::StatusOr<RedisReplyPtr>> Pipeline(
      absl::Span<const RedisCommand> commands);

  bool broken() const { return broken_; }
  // Whether a Pipeline call has completed on it (a connection that sat in
  // the pool may have been closed by the server meanwhile).
  bool used() const { return used_; }

 private:
  explicit RedisConnection(redisContext* context) : context_(context) {}
  absl::Status ContextError() const;

  redisContext* const context_;
  bool broken_ = false;
  bool used_ = false;
};

// The status a Redis error reply stands for: Unauthenticated (NOAUTH,
// WRONGPASS), PermissionDenied (NOPERM), ResourceExhausted (OOM),
// Unavailable (LOADING, BUSY, MASTERDOWN, TRYAGAIN), else Internal; the
// message carries the server's text.
absl::Status RedisErrorReplyStatus(absl::string_view error);

// The status of a reply that is neither what was expected nor an error.
absl::Status UnexpectedReplyStatus(const redisReply& reply,
                                   absl::string_view command);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_REDIS_CONNECTION_H_
