// The multi-user suite (tenants_fixture.h): sessions, pools and segments
// of one user as another user tries them.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/e2e/tenants_fixture.h"

namespace hostkv {
namespace {

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
  const std::string signal_segment = unattached.signal_segment();
  const std::string prefix =
      signal_segment.substr(1, signal_segment.find("signals.") - 1);
  ASSERT_EQ(0u, prefix.rfind("hostkv.", 0)) << signal_segment;
  std::vector<std::string> ours;
  for (const std::string& name : ShmNames()) {
    if (name.rfind(prefix, 0) == 0) ours.push_back(name);
  }
  auto named_for = [&](uint64_t number) {
    const std::string head = absl::StrCat(prefix, "signals.", number, ".");
    return std::count_if(ours.begin(), ours.end(), [&](const std::string& n) {
      return n.rfind(head, 0) == 0;
    });
  };
  EXPECT_EQ(1, named_for(unattached.session_number()));
  EXPECT_EQ(0, named_for(attached->session_number()));
  // No pool segment has a name at all (sealed memfds).
  for (const std::string& name : ours) {
    EXPECT_EQ(std::string::npos, name.find("pool.")) << name;
  }
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
// The owner's read-write descriptor cannot cut the segment short under the
// daemon's mapping (it is a memfd sealed against shrinking): the daemon's
// reads, scrubbing and copies of the pool go on.
TEST_F(TenantsTest, APoolOwnerCannotShrinkItsSegment) {
  std::string out;
  ASSERT_EQ(0, Run(kAlice, {"create-pool", "mine"}, &out)) << out;
  EXPECT_EQ(0, Run(kAlice, {"truncate-segment", "mine"}, &out)) << out;
  EXPECT_NE(std::string::npos, out.find("writable=1")) << out;
  EXPECT_EQ(0, Run(kBob, {"truncate-segment", "shared"}, &out)) << out;
  // The pool still works for its owner: write, free (scrubbed), reallocate
  // zeroed, publish and read back.
  EXPECT_EQ(0, Run(kAlice, {"write-free", "mine", "3"}, &out)) << out;
  EXPECT_EQ(0, Run(kAlice, {"alloc-zeros", "mine", "15"}, &out)) << out;
  EXPECT_EQ(0, Run(kAlice, {"publish", "mine", "after", "2", "77"}, &out)) << out;
  EXPECT_EQ(0, Run(kAlice, {"lookup", "mine", "after", "2"}, &out)) << out;
  EXPECT_NE(std::string::npos, out.find("value 77")) << out;
  EXPECT_EQ(0, kill(daemon_->pid(), 0));
}

// /dev/shm is everybody's: names a user made first, where the daemon's
// next signal segments or a pool's segment would go, block nothing (signal
// segments get unpredictable names; pool segments have none).
TEST_F(TenantsTest, SquattedShmNamesBlockNoSessionOrPool) {
  auto stub = v1::HostKV::NewStub(grpc::CreateChannel(
      daemon_->target(), grpc::InsecureChannelCredentials()));
  auto open_unattached = [&]() {
    grpc::ClientContext context;
    v1::OpenSessionResponse opened;
    const grpc::Status s =
        stub->OpenSession(&context, v1::OpenSessionRequest(), &opened);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return opened;
  };
  const v1::OpenSessionResponse first = open_unattached();
  const std::string name = first.signal_segment();
  const std::string prefix = name.substr(0, name.find("signals."));
  std::string out;
  for (uint64_t n = first.session_number() + 1;
       n <= first.session_number() + 12; ++n) {
    ASSERT_EQ(0, Run(kBob, {"make-shm", absl::StrCat(prefix, "signals.", n),
                            "4096"}, &out)) << out;
  }
  ASSERT_EQ(0, Run(kBob, {"make-shm", prefix + "pool.victim", "4096"}, &out))
      << out;
  for (int i = 0; i < 5; ++i) {
    const v1::OpenSessionResponse opened = open_unattached();
    EXPECT_FALSE(opened.session_id().empty());
    EXPECT_EQ(0u, opened.signal_segment().rfind(prefix, 0));
  }
  EXPECT_EQ(0, Run(kAlice, {"create-pool", "victim"}, &out)) << out;
  for (uint64_t n = first.session_number() + 1;
       n <= first.session_number() + 12; ++n) {
    shm_unlink(absl::StrCat(prefix, "signals.", n).c_str());
  }
  shm_unlink((prefix + "pool.victim").c_str());
}

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
