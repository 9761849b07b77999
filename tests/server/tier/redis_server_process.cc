#include "tests/server/tier/redis_server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace hostkv::testing {

std::string RedisServerProcess::FindBinary() {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    std::string candidate = absl::StrCat(dir, "/redis-server");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

RedisServerProcess::RedisServerProcess() {
  char dir[] = "/tmp/hostkv-redis-XXXXXX";
  if (mkdtemp(dir) != nullptr) dir_ = dir;
  socket_path_ = dir_ + "/redis.sock";
}

RedisServerProcess::~RedisServerProcess() {
  Kill();
  if (!dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

absl::Status RedisServerProcess::Start(const std::string& password) {
  std::vector<std::string> extra;
  if (!password.empty()) extra = {"--requirepass", password};
  return StartWith(std::move(extra));
}

absl::Status RedisServerProcess::StartClusterNode(int port) {
  return StartWith({"--port", std::to_string(port), "--bind", "127.0.0.1",
                    "--cluster-enabled", "yes", "--cluster-config-file",
                    dir_ + "/nodes.conf"});
}

absl::Status RedisServerProcess::StartOnPort(int port) {
  return StartWith({"--port", std::to_string(port), "--bind", "127.0.0.1"});
}

absl::Status RedisServerProcess::StartWith(std::vector<std::string> extra) {
  if (pid_ > 0) return absl::FailedPreconditionError("already running");
  const std::string binary = FindBinary();
  if (binary.empty()) return absl::NotFoundError("no redis-server on PATH");
  unlink(socket_path_.c_str());
  std::vector<std::string> args = {binary,       "--port", "0", "--unixsocket",
                                   socket_path_, "--save", "",  "--appendonly",
                                   "no",         "--dir",  dir_};
  // A later --port wins over the first.
  for (std::string& arg : extra) args.push_back(std::move(arg));
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const std::string log = dir_ + "/redis.log";
  pid_ = fork();
  if (pid_ < 0) return absl::InternalError("fork failed");
  if (pid_ == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  // Ready when a PING gets any reply (NOAUTH counts: it is listening).
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    int wstatus = 0;
    if (waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(
          absl::StrCat("redis-server exited; see ", log));
    }
    redisContext* c = redisConnectUnix(socket_path_.c_str());
    if (c != nullptr && c->err == 0) {
      void* reply = redisCommand(c, "PING");
      if (reply != nullptr) {
        freeReplyObject(reply);
        redisFree(c);
        return absl::OkStatus();
      }
    }
    if (c != nullptr) redisFree(c);
    absl::SleepFor(absl::Milliseconds(20));
  }
  Kill();
  return absl::DeadlineExceededError("redis-server did not answer in 20 s");
}

void RedisServerProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int wstatus = 0;
  waitpid(pid_, &wstatus, 0);
  pid_ = -1;
}

void RedisServerProcess::Pause() {
  if (pid_ > 0) kill(pid_, SIGSTOP);
}

void RedisServerProcess::Resume() {
  if (pid_ > 0) kill(pid_, SIGCONT);
}

RawRedisReply RawRedisCommand(const std::string& socket_path,
                              const std::vector<std::string>& args) {
  RawRedisReply result;
  redisContext* c = redisConnectUnix(socket_path.c_str());
  if (c == nullptr || c->err != 0) {
    if (c != nullptr) redisFree(c);
    return result;
  }
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (const std::string& arg : args) {
    argv.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  auto* reply = static_cast<redisReply*>(redisCommandArgv(
      c, static_cast<int>(argv.size()), argv.data(), lengths.data()));
  if (reply != nullptr) {
    result.type = reply->type;
    if (reply->str != nullptr) result.str.assign(reply->str, reply->len);
    result.integer = reply->integer;
    if (reply->type == REDIS_REPLY_ARRAY) {
      for (size_t i = 0; i < reply->elements; ++i) {
        const redisReply* e = reply->element[i];
        if (e->str != nullptr) result.elements.emplace_back(e->str, e->len);
      }
    }
    freeReplyObject(reply);
  }
  redisFree(c);
  return result;
}

namespace {

// Binds 127.0.0.1:port (0: any); returns the port bound, or 0. The socket
// stays open in *fd.
int BindLoopback(int port, int* fd) {
  *fd = socket(AF_INET, SOCK_STREAM, 0);
  if (*fd < 0) return 0;
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  if (bind(*fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(*fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(*fd);
    *fd = -1;
    return 0;
  }
  return ntohs(addr.sin_port);
}

}  // namespace

int FreeClusterPort() {
  for (int attempt = 0; attempt < 100; ++attempt) {
    int fd = -1;
    int bus_fd = -1;
    const int port = BindLoopback(0, &fd);
    const bool ok = port > 0 && port + 10000 <= 65535 &&
                    BindLoopback(port + 10000, &bus_fd) == port + 10000;
    if (fd >= 0) close(fd);
    if (bus_fd >= 0) close(bus_fd);
    if (ok) return port;
  }
  return 0;
}

}  // namespace hostkv::testing
