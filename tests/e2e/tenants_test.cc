// Several users on one daemon, as a hostile local user would try it: the
// daemon runs as root with --socket_mode=0666 (everybody may connect), and
// the tenants are real processes of two throwaway uids (61001 "alice" and
// 61002 "bob": the test forks, drops to them with setuid and execs
// tenant_client). Needs root; skipped otherwise.
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
namespace {

constexpr uid_t kAlice = 61001;
constexpr uid_t kBob = 61002;
constexpr int kPermissionDenied =
    static_cast<int>(absl::StatusCode::kPermissionDenied);
constexpr int kResourceExhausted =
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
    daemon_ = std::make_unique<testing::DaemonProcess>(std::vector<std::string>{
        "--socket_mode=0666", "--attach_timeout=1s",
        "--max_session_connections_per_uid=64", "--max_sessions_per_uid=8",
        "--max_unattached_sessions=8", "--config=" + config_,
        "--config_pool_access=any"});
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
  void TearDown() override {
    daemon_.reset();
    if (!config_.empty()) std::remove(config_.c_str());
  }

  // Starts tenant_client ARGS as `uid` (gid = uid, no supplementary
  // groups); `pass_fd`, if >= 0, becomes its fd 3.
  Tenant Start(uid_t uid, std::vector<std::string> args, int pass_fd = -1) {
    int pipe_fds[2];
    EXPECT_EQ(0, pipe(pipe_fds));
    args.insert(args.begin(), {binary_, daemon_->target()});
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
          std::string* out = nullptr) {
    Tenant t = Start(uid, std::move(args));
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

std::vector<std::string> ShmNames() {
  std::vector<std::string> names;
  DIR* dir = opendir("/dev/shm");
  while (dirent* e = dir != nullptr ? readdir(dir) : nullptr)
    names.push_back(e->d_name);
  if (dir != nullptr) closedir(dir);
  return names;
}

// The secret appears in no /dev/shm name and no log line: attached sessions
// have no named signal segment at all, unattached ones are named by their
// public number.
TEST_F(TenantsTest, SessionSecretsAppearInNoNameOrLog) {
  auto attached = Root();
  ASSERT_NE(nullptr, attached);
  auto channel = grpc::CreateChannel(daemon_->target(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::HostKV::NewStub(channel);
  grpc::ClientContext context;
  v1::OpenSessionResponse unattached;
  ASSERT_TRUE(
      stub->OpenSession(&context, v1::OpenSessionRequest(), &unattached).ok());
  ASSERT_EQ(kSessionIdBytes, attached->session_id().size());
  ASSERT_EQ(kSessionIdBytes, unattached.session_id().size());
  const std::string pool_segment = attached->GetPool("shared")->segment_name();
  const std::string prefix =
      pool_segment.substr(1, pool_segment.find("pool.") - 1);
  std::vector<std::string> ours;
  for (const std::string& name : ShmNames()) {
    if (name.rfind(prefix, 0) == 0) ours.push_back(name);
  }
  EXPECT_NE(ours.end(), std::find(ours.begin(), ours.end(),
                                  absl::StrCat(prefix, "signals.",
                                               unattached.session_number())));
  EXPECT_EQ(ours.end(), std::find(ours.begin(), ours.end(),
                                  absl::StrCat(prefix, "signals.",
                                               attached->session_number())));
  const std::string log = daemon_->log();
  for (const std::string& id :
       {attached->session_id(), unattached.session_id()}) {
    const std::string hex = absl::BytesToHexString(id);
    for (const std::string& part : {hex, hex.substr(0, 16), hex.substr(16)}) {
      EXPECT_EQ(std::string::npos, log.find(part));
      for (const std::string& name : ours)
        EXPECT_EQ(std::string::npos, name.find(part));
    }
  }
}

// 300 ids: 16 bytes each, all distinct, and about half of their bits set.
TEST_F(TenantsTest, SessionIdsAreLongAndUnpredictable) {
  auto channel = grpc::CreateChannel(daemon_->target(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::HostKV::NewStub(channel);
  std::set<std::string> ids;
  uint64_t ones = 0;
  for (int i = 0; i < 300; ++i) {
    grpc::ClientContext open_context, close_context;
    v1::OpenSessionResponse opened;
    ASSERT_TRUE(
        stub->OpenSession(&open_context, v1::OpenSessionRequest(), &opened)
            .ok());
    ASSERT_EQ(kSessionIdBytes, opened.session_id().size());
    ids.insert(opened.session_id());
    for (unsigned char c : opened.session_id()) ones += __builtin_popcount(c);
    v1::CloseSessionRequest close;
    close.set_session_id(opened.session_id());
    v1::CloseSessionResponse closed;
    ASSERT_TRUE(stub->CloseSession(&close_context, close, &closed).ok());
  }
  EXPECT_EQ(300u, ids.size());
  const double share = static_cast<double>(ones) / (300 * 128);
  EXPECT_GT(share, 0.45);
  EXPECT_LT(share, 0.55);
}

// A connection made by root and handed to a process of another uid cannot
// open (or attach) a session as root: the credentials of each record count.
TEST_F(TenantsTest, HandedConnectionIsRefused) {
  const std::string path = daemon_->socket_path() + kSessionSocketSuffix;
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(0, connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  std::string out;
  Tenant t = Start(kAlice, {"handed-fd"}, fd);
  close(fd);
  std::string line = t.ReadLine();
  EXPECT_EQ(kPermissionDenied, t.Wait()) << line;
  EXPECT_NE(std::string::npos, line.find("another user")) << line;
}

// Named segments register only for their owner, root included; another
// user's pool cannot be attached to.
TEST_F(TenantsTest, SegmentsAndPoolsOfAnotherUserAreRefused) {
  const std::string segment = absl::StrCat("/tenant-alice-", getpid());
  ASSERT_EQ(0, Run(kAlice, {"make-shm", segment, "65536"}));
  ASSERT_EQ(0, Run(kAlice, {"create-pool", "alice-pool"}));
  std::string out;
  EXPECT_EQ(0, Run(kAlice, {"register-shm", "alice-pool", segment}, &out))
      << out;
  EXPECT_EQ(kPermissionDenied, Run(kBob, {"attach-pool", "alice-pool"}, &out))
      << out;
  EXPECT_EQ(kPermissionDenied, Run(kBob, {"alloc", "alice-pool", "4"}, &out))
      << out;
  EXPECT_EQ(0, Run(kBob, {"create-pool", "bob-pool"}, &out)) << out;
  EXPECT_EQ(kPermissionDenied,
            Run(kBob, {"register-shm", "bob-pool", segment}, &out))
      << out;
  auto root = Root();  // root is checked like anyone: alice's segment is hers
  ASSERT_NE(nullptr, root);
  absl::StatusOr<v1::Pool> pool = root->GetPool("shared");
  ASSERT_OK(pool);
  std::vector<v1::DeviceBuffer> k(2), v(2);
  for (auto* side : {&k, &v}) {
    for (v1::DeviceBuffer& b : *side) {
      b.set_shm_name(segment);
      b.set_size(4 * pool->token_stride());
    }
  }
  auto refused = root->RegisterDeviceBuffers("shared", 4, k, v);
  EXPECT_ERROR(PermissionDenied, refused);
  EXPECT_NE(std::string::npos,
            refused.status().ToString().find("belongs to uid 61001"))
      << refused.status();
  shm_unlink(segment.c_str());
}

// Only the creator (or root) deletes or redefines a pool.
TEST_F(TenantsTest, PoolsBelongToTheirCreator) {
  std::string out;
  ASSERT_EQ(0, Run(kAlice, {"create-pool", "p1"}, &out)) << out;
  EXPECT_EQ(kPermissionDenied, Run(kBob, {"delete-pool", "p1"}, &out)) << out;
  EXPECT_EQ(static_cast<int>(absl::StatusCode::kAlreadyExists),
            Run(kBob, {"create-pool", "p1"}, &out))
      << out;
  EXPECT_EQ(0, Run(kAlice, {"delete-pool", "p1"}, &out)) << out;
  ASSERT_EQ(0, Run(kAlice, {"create-pool", "p2"}, &out)) << out;
  auto root = Root();
  ASSERT_NE(nullptr, root);
  EXPECT_OK(root->DeletePool("p2"));
  auto stats = root->GetPoolStats();
  ASSERT_OK(stats);
  EXPECT_EQ(1, stats->pools_size());  // "shared" only
}

// kFetchPoolSegment: the owner gets a read-write descriptor of its pool's
// segment, a user the pool only admits a read-only one (the kernel refuses
// a writable mapping of it), a user it does not admit none.
TEST_F(TenantsTest, PoolSegmentsGoOutReadWriteOnlyToTheirOwner) {
  std::string out;
  ASSERT_EQ(0, Run(kAlice, {"create-pool", "mine"}, &out)) << out;
  EXPECT_EQ(0, Run(kAlice, {"fetch-segment", "mine"}, &out)) << out;
  EXPECT_NE(std::string::npos, out.find("writable=1")) << out;
  EXPECT_EQ(0, Run(kBob, {"fetch-segment", "shared"}, &out)) << out;
  EXPECT_NE(std::string::npos, out.find("writable=0")) << out;
  EXPECT_EQ(kPermissionDenied, Run(kBob, {"fetch-segment", "mine"}, &out)) << out;
  EXPECT_EQ(static_cast<int>(absl::StatusCode::kNotFound),
            Run(kBob, {"fetch-segment", "absent"}, &out))
      << out;
}

// A session flood by one uid stops at --max_sessions_per_uid (8) with
// RESOURCE_EXHAUSTED; other users open sessions meanwhile, and so does the
// same uid once the flood ends.
TEST_F(TenantsTest, SessionFloodStopsAtThePerUidLimit) {
  Tenant flood = Start(kAlice, {"open-sessions", "50", "1500"});
  const std::string line = flood.ReadLine();
  EXPECT_EQ(0u, line.find(absl::StrCat("opened 8 code ", kResourceExhausted)))
      << line;
  EXPECT_NE(std::string::npos, line.find("--max_sessions_per_uid")) << line;
  auto root = Root();
  ASSERT_NE(nullptr, root);
  EXPECT_OK(root->Alloc("shared", 4));
  std::string out;
  EXPECT_EQ(0, Run(kBob, {"alloc", "shared", "4"}, &out)) << out;
  EXPECT_EQ(0, flood.Wait());
  EXPECT_EQ(0, Run(kAlice, {"alloc", "shared", "4"}, &out)) << out;
}

// Sessions without a session socket (their user unknown) stop at
// --max_unattached_sessions (8); clients on the session socket are not
// affected.
TEST_F(TenantsTest, UnattachedSessionFloodStopsAtItsLimit) {
  auto channel = grpc::CreateChannel(daemon_->target(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::HostKV::NewStub(channel);
  int opened = 0;
  grpc::Status last;
  for (int i = 0; i < 20 && last.ok(); ++i) {
    grpc::ClientContext context;
    v1::OpenSessionResponse response;
    last = stub->OpenSession(&context, v1::OpenSessionRequest(), &response);
    if (last.ok()) ++opened;
  }
  EXPECT_EQ(8, opened);
  EXPECT_EQ(grpc::StatusCode::RESOURCE_EXHAUSTED, last.error_code());
  EXPECT_NE(std::string::npos,
            last.error_message().find("--max_unattached_sessions"));
  std::string out;
  EXPECT_EQ(0, Run(kBob, {"alloc", "shared", "4"}, &out)) << out;
}

// 2,000 idle connections from one uid: beyond
// --max_session_connections_per_uid (64) they are refused at once, the 64
// kept are closed after --attach_timeout (1 s), and meanwhile everyone else
// is served.
TEST_F(TenantsTest, IdleConnectionsAreCappedAndTimedOut) {
  Tenant idle = Start(kAlice, {"idle-connections", "2000", "3000"});
  const std::string connected = idle.ReadLine();
  EXPECT_EQ(0u, connected.find("connected ")) << connected;
  auto root = Root();
  ASSERT_NE(nullptr, root);
  EXPECT_OK(root->Alloc("shared", 4));
  std::string out;
  EXPECT_EQ(0, Run(kBob, {"alloc", "shared", "4"}, &out)) << out;
  const std::string result = idle.ReadLine();
  EXPECT_EQ(0, idle.Wait());
  int open = -1, exhausted = -1, timed_out = -1;
  ASSERT_EQ(3, std::sscanf(result.c_str(), "open %d exhausted %d timed_out %d",
                           &open, &exhausted, &timed_out))
      << connected << result;
  EXPECT_EQ(0, open);
  EXPECT_EQ(64, timed_out);
  int accepted = 0;
  std::sscanf(connected.c_str(), "connected %d", &accepted);
  EXPECT_EQ(accepted - 64, exhausted) << connected << result;
  EXPECT_NE(std::string::npos, daemon_->log().find("did not attach in time"));
}

// A page one user wrote and freed comes back to the next user as zeros.
TEST_F(TenantsTest, FreedPagesComeBackZeroed) {
  std::string out;
  ASSERT_EQ(0, Run(kAlice, {"write-free", "shared", "15"}, &out)) << out;
  EXPECT_EQ(0, Run(kBob, {"alloc-zeros", "shared", "15"}, &out)) << out;
}

}  // namespace
}  // namespace hostkv
