// The multi-user suite's fixture: several users on one daemon, as a hostile
// local user would try it. The daemon runs as root with --socket_mode=0666
// (everybody may connect), and the tenants are real processes of two
// throwaway uids (61001 "alice" and 61002 "bob": the test forks, drops to
// them with setuid and execs tenant_client). Needs root; skipped otherwise.
#ifndef HOSTKV_TESTS_E2E_TENANTS_FIXTURE_H_
#define HOSTKV_TESTS_E2E_TENANTS_FIXTURE_H_

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "hostkv/client.h"
#include "hostkv/v1/hostkv.grpc.pb.h"
#include "proto/contract/session_socket.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {

inline constexpr uid_t kAlice = 61001;
inline constexpr uid_t kBob = 61002;
inline constexpr int kPermissionDenied =
    static_cast<int>(absl::StatusCode::kPermissionDenied);
inline constexpr int kResourceExhausted =
    static_cast<int>(absl::StatusCode::kResourceExhausted);

// A tenant_client process running as another uid.
struct Tenant {
  pid_t pid = -1;
  FILE* out = nullptr;

  std::string ReadLine() {
    char line[512] = {};
    return std::fgets(line, sizeof(line), out) != nullptr ? line : "";
  }
  // The exit code (-1 if killed).
  int Wait() {
    int status = 0;
    waitpid(pid, &status, 0);
    std::fclose(out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

class TenantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) {
      GTEST_SKIP() << "the multi-user tests run tenants as throwaway uids "
                      "61001/61002 and need root (setuid); skipped";
    }
    config_ = "/tmp/hostkv-tenants-" + std::to_string(getpid()) + ".textproto";
    std::ofstream(config_)
        << "pools { name: \"shared\" geometry { mha { num_layers: 2 "
           "num_kv_heads: 1 head_dim: 8 } dtype: DTYPE_BF16 } page_size: 4 "
           "layout: LAYOUT_PAGE_FIRST capacity_tokens: 60 }\n";
    std::vector<std::string> flags = {
        "--socket_mode=0666", "--attach_timeout=1s",
        "--max_session_connections_per_uid=64", "--max_sessions_per_uid=8",
        "--max_unattached_sessions=8", "--config=" + config_,
        "--config_pool_access=any"};
    for (std::string& flag : ExtraFlags()) flags.push_back(std::move(flag));
    daemon_ = std::make_unique<testing::DaemonProcess>(flags);
    ASSERT_TRUE(daemon_->started()) << daemon_->log();
    // The tenants must reach the socket and run the client from a place
    // they may read.
    dir_ = daemon_->socket_path().substr(0, daemon_->socket_path().rfind('/'));
    chmod(dir_.c_str(), 0755);
    binary_ = dir_ + "/tenant_client";
    std::ifstream in(TENANT_CLIENT_BINARY, std::ios::binary);
    std::ofstream(binary_, std::ios::binary) << in.rdbuf();
    chmod(binary_.c_str(), 0755);
  }
  // Flags a suite adds to the daemon's.
  virtual std::vector<std::string> ExtraFlags() { return {}; }

  void TearDown() override {
    daemon_.reset();
    if (!config_.empty()) std::remove(config_.c_str());
  }

  // Starts tenant_client ARGS as `uid` (gid = uid, no supplementary
  // groups); `pass_fd`, if >= 0, becomes its fd 3.
  // `target`: another daemon's (empty: the fixture's).
  Tenant Start(uid_t uid, std::vector<std::string> args, int pass_fd = -1,
               const std::string& target = "") {
    int pipe_fds[2];
    EXPECT_EQ(0, pipe(pipe_fds));
    args.insert(args.begin(),
                {binary_, target.empty() ? daemon_->target() : target});
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(pipe_fds[1], STDOUT_FILENO);
      if (pass_fd >= 0) dup2(pass_fd, 3);
      rlimit files{4096, 4096};
      setrlimit(RLIMIT_NOFILE, &files);
      if (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0) {
        _exit(120);
      }
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(pipe_fds[1]);
    return Tenant{pid, fdopen(pipe_fds[0], "r")};
  }
  // Runs tenant_client to its end; returns its exit code (an absl code).
  int Run(uid_t uid, std::vector<std::string> args,
          std::string* out = nullptr, const std::string& target = "") {
    Tenant t = Start(uid, std::move(args), -1, target);
    std::string all, line;
    while (!(line = t.ReadLine()).empty()) all += line;
    if (out != nullptr) *out = all;
    return t.Wait();
  }

  std::unique_ptr<Client> Root() {
    auto client = Client::Connect(daemon_->target(), "root");
    EXPECT_OK(client);
    return client.ok() ? std::move(*client) : nullptr;
  }

  std::string config_;
  std::string dir_;
  std::string binary_;
  std::unique_ptr<testing::DaemonProcess> daemon_;
};

inline std::vector<std::string> ShmNames() {
  std::vector<std::string> names;
  DIR* dir = opendir("/dev/shm");
  while (dirent* e = dir != nullptr ? readdir(dir) : nullptr)
    names.push_back(e->d_name);
  if (dir != nullptr) closedir(dir);
  return names;
}

}  // namespace hostkv

#endif  // HOSTKV_TESTS_E2E_TENANTS_FIXTURE_H_
