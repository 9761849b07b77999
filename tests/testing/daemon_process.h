// Starts the real hostkvd binary on a private Unix socket for end-to-end
// tests, and stops it.
#ifndef HOSTKV_TESTS_TESTING_DAEMON_PROCESS_H_
#define HOSTKV_TESTS_TESTING_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace hostkv::testing {

class DaemonProcess {
 public:
  // Starts Binary() with --listen=`listen` (default: a Unix socket in a
  // fresh temp dir), a small memory reserve, and `extra_args`; waits until
  // it logs that it listens (up to 10 s). started() says whether it did.
  // With HOSTKVD_LOADER set (a dynamic loader, e.g. the GPU bundle's
  // lib/ld-linux-x86-64.so.2), the daemon runs through that loader with
  // --library-path HOSTKVD_LIBRARY_PATH (default: the loader's folder); its
  // pid is still the daemon's. The daemon gets SIGKILL when the thread that
  // started it dies (PR_SET_PDEATHSIG).
  explicit DaemonProcess(std::vector<std::string> extra_args = {},
                         std::string listen = "");
  ~DaemonProcess();  // SIGTERM (then SIGKILL) if the daemon still runs

  bool started() const { return started_; }
  pid_t pid() const { return pid_; }
  const std::string& socket_path() const { return socket_path_; }
  const std::string& target() const { return target_; }
  // The daemon's stderr so far.
  std::string log() const;

  // After Stop: a new daemon with the same flags (and `extra_args`) on the
  // same socket, its log in a new file (log() reads it). Waits as the
  // constructor does; returns started().
  bool Restart(const std::vector<std::string>& extra_args = {});

  // Sends `signal` and waits for the exit; returns the exit code (or 128 +
  // signal number if killed), -1 on timeout.
  int Stop(int signal, int timeout_ms = 10000);

  // The hostkvd binary: $HOSTKVD_BINARY when set and not empty, else the
  // build's own (the HOSTKVD_BINARY definition compiled in).
  static std::string Binary();

  // Runs hostkvd with `args` to completion (for start-up failures); returns
  // its exit code and puts its stderr in *log.
  static int RunToExit(const std::vector<std::string>& args, std::string* log);

 private:
  std::string dir_;
  std::string socket_path_;
  std::string target_;
  std::string log_path_;
  pid_t pid_ = -1;
  bool started_ = false;
  std::vector<std::string> args_;
  bool unix_ = true;
  int restarts_ = 0;
  void WaitStarted();
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreeTcpPort();

}  // namespace hostkv::testing

#endif  // HOSTKV_TESTS_TESTING_DAEMON_PROCESS_H_
