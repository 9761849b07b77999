#include "server/tier/redis_connection.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace hostkv {
namespace {

// hiredis writes with write(2): a server that went away would raise SIGPIPE
// and kill the daemon. The calling thread blocks SIGPIPE for the call and
// takes back a SIGPIPE that the call raised (EPIPE is then a plain error).
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe_, &old_) == 0;
  }
  ~ScopedSigpipeBlock() {
    if (!blocked_) return;
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero = {0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
  bool blocked_ = false;
};

// A context's error as a status: a timeout (EAGAIN on a socket with
// SO_RCVTIMEO, or ETIMEDOUT while connecting) is DeadlineExceeded, the rest
// of the socket's failures Unavailable.
absl::Status ContextStatus(const redisContext& context, int saved_errno,
                           absl::string_view what) {
  const std::string text = absl::StrCat(what, ": ", context.errstr);
  const bool timed_out =
      saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
      saved_errno == ETIMEDOUT ||
      absl::StrContains(context.errstr, std::strerror(EAGAIN)) ||
      absl::StrContains(context.errstr, std::strerror(ETIMEDOUT));
  if (context.err == REDIS_ERR_IO && timed_out) {
    return absl::DeadlineExceededError(text);
  }
  if (context.err == REDIS_ERR_OOM) return absl::ResourceExhaustedError(text);
  return absl::UnavailableError(text);
}

timeval ToTimevalAtLeast1ms(absl::Duration d) {
  return absl::ToTimeval(std::max(d, absl::Milliseconds(1)));
}

}  // namespace

absl::StatusOr<RedisAddress> RedisAddress::Parse(absl::string_view address) {
  RedisAddress parsed;
  if (absl::ConsumePrefix(&address, "unix:")) {
    if (address.empty()) {
      return absl::InvalidArgumentError("redis address: empty unix path");
    }
    parsed.unix_path = std::string(address);
    return parsed;
  }
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &parsed.port) ||
      parsed.port <= 0 || parsed.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "redis address \"", address, "\": expected host:port or unix:/path"));
  }
  parsed.host = std::string(address.substr(0, colon));
  return parsed;
}

std::string RedisAddress::Describe() const {
  if (!unix_path.empty()) return absl::StrCat("redis+unix:", unix_path);
  return absl::StrCat("redis://", host, ":", port);
}

void RedisReplyDeleter::operator()(redisReply* reply) const {
  freeReplyObject(reply);
}

absl::StatusOr<std::unique_ptr<RedisConnection>> RedisConnection::Open(
    const RedisAddress& address, const std::string& password,
    absl::Duration connect_timeout, absl::Duration call_timeout) {
  const timeval connect_tv = ToTimevalAtLeast1ms(connect_timeout);
  errno = 0;
  redisContext* context =
      address.unix_path.empty()
          ? redisConnectWithTimeout(address.host.c_str(), address.port,
                                    connect_tv)
          : redisConnectUnixWithTimeout(address.unix_path.c_str(), connect_tv);
  const int saved_errno = errno;
  const std::string where = address.Describe();
  if (context == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(where, ": cannot allocate a hiredis context"));
  }
  if (context->err != 0) {
    absl::Status status =
        ContextStatus(*context, saved_errno, absl::StrCat(where, ": connect"));
    redisFree(context);
    return status;
  }
  std::unique_ptr<RedisConnection> connection(new RedisConnection(context));
  if (redisSetTimeout(context, ToTimevalAtLeast1ms(call_timeout)) != REDIS_OK) {
    return absl::UnavailableError(
        absl::StrCat(where, ": cannot set the socket timeout"));
  }
  if (password.empty()) return connection;
  const RedisCommand auth = {"AUTH", password};
  auto replies = connection->Pipeline({&auth, 1});
  if (!replies[0].ok()) return replies[0].status();
  const redisReply& reply = **replies[0];
  if (reply.type == REDIS_REPLY_ERROR) {
    return absl::UnauthenticatedError(absl::StrCat(
        where, ": AUTH refused: ", absl::string_view(reply.str, reply.len)));
  }
  if (reply.type != REDIS_REPLY_STATUS) {
    return UnexpectedReplyStatus(reply, "AUTH");
  }
  return connection;
}

RedisConnection::~RedisConnection() { redisFree(context_); }

std::vector<absl::StatusOr<RedisReplyPtr>> RedisConnection::Pipeline(
    absl::Span<const RedisCommand> commands) {
  std::vector<absl::StatusOr<RedisReplyPtr>> replies;
  replies.reserve(commands.size());
  if (broken_) {
    const absl::Status status =
        absl::UnavailableError("redis connection is broken");
    while (replies.size() < commands.size()) replies.push_back(status);
    return replies;
  }
  ScopedSigpipeBlock no_sigpipe;
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (const RedisCommand& command : commands) {
    argv.clear();
    lengths.clear();
    for (absl::string_view arg : command) {
      argv.push_back(arg.data());
      lengths.push_back(arg.size());
    }
    if (redisAppendCommandArgv(context_, static_cast<int>(argv.size()),
                               argv.data(), lengths.data()) != REDIS_OK) {
      broken_ = true;
      const absl::Status status = ContextStatus(*context_, 0, "redis");
      while (replies.size() < commands.size()) replies.push_back(status);
      return replies;
    }
  }
  for (size_t i = 0; i < commands.size(); ++i) {
    void* reply = nullptr;
    errno = 0;
    if (redisGetReply(context_, &reply) != REDIS_OK || reply == nullptr) {
      const int saved_errno = errno;
      broken_ = true;
      const absl::Status status =
          ContextStatus(*context_, saved_errno, "redis");
      while (replies.size() < commands.size()) replies.push_back(status);
      return replies;
    }
    replies.push_back(RedisReplyPtr(static_cast<redisReply*>(reply)));
  }
  used_ = true;
  return replies;
}

absl::Status RedisErrorReplyStatus(absl::string_view error) {
  const std::string text = absl::StrCat("redis: ", error);
  if (absl::StartsWith(error, "NOAUTH") ||
      absl::StartsWith(error, "WRONGPASS")) {
    return absl::UnauthenticatedError(text);
  }
  if (absl::StartsWith(error, "NOPERM"))
    return absl::PermissionDeniedError(text);
  if (absl::StartsWith(error, "OOM")) return absl::ResourceExhaustedError(text);
  if (absl::StartsWith(error, "LOADING") || absl::StartsWith(error, "BUSY") ||
      absl::StartsWith(error, "MASTERDOWN") ||
      absl::StartsWith(error, "TRYAGAIN") ||
      absl::StartsWith(error, "CLUSTERDOWN")) {
    return absl::UnavailableError(text);
  }
  return absl::InternalError(text);
}

absl::Status UnexpectedReplyStatus(const redisReply& reply,
                                   absl::string_view command) {
  if (reply.type == REDIS_REPLY_ERROR) {
    return RedisErrorReplyStatus(absl::string_view(reply.str, reply.len));
  }
  return absl::InternalError(absl::StrCat("redis: unexpected reply of type ",
                                          reply.type, " to ", command));
}

}  // namespace hostkv
