#include "tests/server/tier/redis_server_process.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <signal.h>
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
  if (pid_ > 0) return absl::FailedPreconditionError("already running");
  const std::string binary = FindBinary();
  if (binary.empty()) return absl::NotFoundError("no redis-server on PATH");
  unlink(socket_path_.c_str());
  std::vector<std::string> args = {binary,       "--port", "0", "--unixsocket",
                                   socket_path_, "--save", "",  "--appendonly",
                                   "no",         "--dir",  dir_};
  if (!password.empty()) {
    args.push_back("--requirepass");
    args.push_back(password);
  }
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

}  // namespace hostkv::testing
