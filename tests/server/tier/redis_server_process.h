// A real redis-server for a test: on a Unix socket of its own in a temp
// dir, no persistence; killed when the object goes.
#ifndef HOSTKV_TESTS_SERVER_TIER_REDIS_SERVER_PROCESS_H_
#define HOSTKV_TESTS_SERVER_TIER_REDIS_SERVER_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

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
  // Starts a cluster-enabled node on 127.0.0.1:port (and socket_path()).
  absl::Status StartClusterNode(int port);
  // Starts a plain (not cluster) server on 127.0.0.1:port too.
  absl::Status StartOnPort(int port);
  // SIGKILL and wait.
  void Kill();
  // SIGSTOP / SIGCONT: a server that does not answer, then answers again.
  void Pause();
  void Resume();

  const std::string& socket_path() const { return socket_path_; }
  std::string address() const { return "unix:" + socket_path_; }

 private:
  absl::Status StartWith(std::vector<std::string> extra_args);

  std::string dir_;
  std::string socket_path_;
  pid_t pid_ = -1;
};

// A reply of a command sent on its own connection; type -1 if none came.
struct RawRedisReply {
  int type = -1;
  std::string str;  // string, status or error
  long long integer = 0;
  std::vector<std::string> elements;  // an array's string elements
};
RawRedisReply RawRedisCommand(const std::string& socket_path,
                              const std::vector<std::string>& args);

// A TCP port on 127.0.0.1 free now, with port + 10000 (the cluster bus)
// free too; 0 if none was found.
int FreeClusterPort();

}  // namespace hostkv::testing

#endif  // HOSTKV_TESTS_SERVER_TIER_REDIS_SERVER_PROCESS_H_
