#include "tests/testing/daemon_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace hostkv::testing {
namespace {

std::string Getenv(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// argv for hostkvd with `args`: the binary itself, or, with HOSTKVD_LOADER
// set, that dynamic loader running it on HOSTKVD_LIBRARY_PATH (default: the
// loader's own folder), as in the GPU bundle (tests/gpu/bundle.sh).
std::vector<std::string> DaemonArgv(const std::vector<std::string>& args) {
  std::vector<std::string> argv;
  const std::string loader = Getenv("HOSTKVD_LOADER");
  if (!loader.empty()) {
    std::string libs = Getenv("HOSTKVD_LIBRARY_PATH");
    if (libs.empty()) {
      const size_t slash = loader.rfind('/');
      libs = slash == std::string::npos ? "." : loader.substr(0, slash);
    }
    argv = {loader, "--library-path", libs, "--argv0", "hostkvd"};
  }
  argv.push_back(DaemonProcess::Binary());
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

pid_t Spawn(const std::vector<std::string>& args, const std::string& log_path) {
  std::vector<std::string> strings = DaemonArgv(args);
  std::vector<char*> argv;
  for (std::string& a : strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // The daemon dies with the thread that started it (a killed or timed-out
    // test leaves no hostkvd behind); the check closes the race with a
    // parent that died before prctl.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDERR_FILENO);
      dup2(fd, STDOUT_FILENO);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

bool CanConnect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok =
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

int WaitExit(pid_t pid, int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

DaemonProcess::DaemonProcess(std::vector<std::string> extra_args,
                             std::string listen) {
  char tmpl[] = "/tmp/hostkv-e2e-XXXXXX";
  dir_ = mkdtemp(tmpl);
  socket_path_ = dir_ + "/hostkvd.sock";
  log_path_ = dir_ + "/hostkvd.log";
  target_ = listen.empty() ? "unix:" + socket_path_ : listen;
  if (listen.rfind("tcp:", 0) == 0) target_ = "127.0.0.1:" + listen.substr(4);
  std::vector<std::string> args = {"--listen=" + (listen.empty() ? target_ : listen),
                                   "--memory_reserve=256MiB",
                                   "--log_level=debug"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  args_ = args;
  unix_ = listen.empty();
  pid_ = Spawn(args, log_path_);
  WaitStarted();
}

bool DaemonProcess::Restart(const std::vector<std::string>& extra_args) {
  if (pid_ > 0) return false;
  std::vector<std::string> args = args_;
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  log_path_ = absl::StrCat(dir_, "/hostkvd.", ++restarts_, ".log");
  started_ = false;
  pid_ = Spawn(args, log_path_);
  WaitStarted();
  return started_;
}

void DaemonProcess::WaitStarted() {
  for (int i = 0; i < 1000 && !started_; ++i) {
    if (log().find("listening on") != std::string::npos &&
        (!unix_ || CanConnect(socket_path_))) {
      started_ = true;
      break;
    }
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

DaemonProcess::~DaemonProcess() {
  // SIGTERM first, so that the daemon removes its segments from /dev/shm.
  if (pid_ > 0 && Stop(SIGTERM, 10000) == -1) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::system(("rm -rf " + dir_).c_str());
}

std::string DaemonProcess::Binary() {
  const std::string binary = Getenv("HOSTKVD_BINARY");
  return binary.empty() ? HOSTKVD_BINARY : binary;
}

std::string DaemonProcess::log() const { return ReadFile(log_path_); }

int DaemonProcess::Stop(int signal, int timeout_ms) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal);
  const int code = WaitExit(pid_, timeout_ms);
  if (code != -1) pid_ = -1;
  return code;
}

int DaemonProcess::RunToExit(const std::vector<std::string>& args,
                             std::string* log) {
  char tmpl[] = "/tmp/hostkv-e2e-log-XXXXXX";
  const int fd = mkstemp(tmpl);
  close(fd);
  const pid_t pid = Spawn(args, tmpl);
  const int code = WaitExit(pid, 20000);
  if (code == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  *log = ReadFile(tmpl);
  unlink(tmpl);
  return code;
}

int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace hostkv::testing
