// A real redis-server for a test: on a Unix socket of its own in a temp
// dir, no persistence; killed when the object goes.
#ifndef HOSTKV_TESTS_SERVER_TIER_REDIS_SERVER_PROCESS_H_
#define HOSTKV_TESTS_SERVER_TIER_REDIS_SERVER_PROCESS_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"

namespace hostkv::testing {

class RedisServerProcess {
 public:
  // The redis-server binary on PATH, or "" if there is none.
  static std::string FindBinary();

  // A temp dir for the socket and the log; nothing runs yet.
  RedisServerProcess();
  ~RedisServerProcess();  // kills the server, removes the dir
  RedisServerProcess(const RedisServerProcess&) = delete;
  RedisServerProcess& operator=(const RedisServerProcess&) = delete;

  // Starts redis-server (with --requirepass when password is not empty) on
  // socket_path() and waits until it answers.
  absl::Status Start(const std::string& password = "");
  // SIGKILL and wait.
  void Kill();
  // SIGSTOP / SIGCONT: a server that does not answer, then answers again.
  void Pause();
  void Resume();

  const std::string& socket_path() const { return socket_path_; }
  std::string address() const { return "unix:" + socket_path_; }

 private:
  std::string dir_;
  std::string socket_path_;
  pid_t pid_ = -1;
};

}  // namespace hostkv::testing

#endif  // HOSTKV_TESTS_SERVER_TIER_REDIS_SERVER_PROCESS_H_
