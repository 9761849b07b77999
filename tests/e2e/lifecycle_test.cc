// Start-up, configuration, session release and shutdown of the real daemon.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "hostkv/client.h"
#include "hostkv/v1/hostkv.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string WriteConfig(const std::string& text) {
  char path[] = "/tmp/hostkv-config-XXXXXX";
  const int fd = mkstemp(path);
  close(fd);
  std::ofstream(path) << text;
  return path;
}

constexpr char kConfig[] = R"pb(
  pools {
    name: "llama"
    geometry { mha { num_layers: 4 num_kv_heads: 2 head_dim: 64 } dtype: DTYPE_BF16 }
    page_size: 16
    layout: LAYOUT_PAGE_FIRST
    capacity_tokens: 1000
  }
  pools {
    name: "deepseek"
    geometry { mla { num_layers: 2 kv_lora_rank: 64 qk_rope_head_dim: 16 } dtype: DTYPE_FP8_E4M3 }
    page_size: 64
    layout: LAYOUT_LAYER_FIRST
    capacity_bytes: 10000000
  }
)pb";

TEST(LifecycleTest, ConfigPoolsExistAtStartAndSigtermCleansUp) {
  const std::string config = WriteConfig(kConfig);
  testing::DaemonProcess daemon({"--config=" + config});
  ASSERT_TRUE(daemon.started()) << daemon.log();
  auto client = Client::Connect(daemon.target(), "t");
  ASSERT_OK(client);
  auto pools = (*client)->ListPools();
  ASSERT_OK(pools);
  ASSERT_EQ(2u, pools->size());
  EXPECT_EQ("deepseek", (*pools)[0].spec().name());
  EXPECT_EQ(1008u, (*pools)[1].token_slots());
  // Pool segments are sealed memfds: nothing in /dev/shm to squat or leave.
  EXPECT_EQ(0u, (*pools)[1].segment_name().rfind("memfd:", 0))
      << (*pools)[1].segment_name();
  EXPECT_TRUE(Exists(daemon.socket_path()));
  struct stat st;
  ASSERT_EQ(0, stat(daemon.socket_path().c_str(), &st));
  EXPECT_EQ(0660u, st.st_mode & 0777);
  client->reset();
  EXPECT_EQ(0, daemon.Stop(SIGTERM));
  EXPECT_FALSE(Exists(daemon.socket_path()));
  std::remove(config.c_str());
}

// A session opened over gRPC alone (no session socket) has a named signal
// segment in /dev/shm; a killed daemon leaves it, the next one on the same
// socket removes it.
TEST(LifecycleTest, RestartOnTheSameSocketRemovesAKilledDaemonsSegments) {
  const std::string config = WriteConfig(kConfig);
  char dir_template[] = "/tmp/hostkv-restart-XXXXXX";
  const std::string listen = std::string("unix:") + mkdtemp(dir_template) + "/d.sock";
  std::string segment;
  {
    testing::DaemonProcess first({"--config=" + config}, listen);
    ASSERT_TRUE(first.started()) << first.log();
    auto stub = v1::HostKV::NewStub(
        grpc::CreateChannel(listen, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::OpenSessionResponse opened;
    ASSERT_TRUE(
        stub->OpenSession(&context, v1::OpenSessionRequest(), &opened).ok());
    segment = "/dev/shm" + opened.signal_segment();
    EXPECT_TRUE(Exists(segment)) << segment;
    EXPECT_EQ(128 + SIGKILL, first.Stop(SIGKILL));
  }
  EXPECT_TRUE(Exists(segment));  // a killed daemon cleans nothing
  testing::DaemonProcess second({"--config=" + config}, listen);
  ASSERT_TRUE(second.started()) << second.log();
  EXPECT_NE(std::string::npos, second.log().find("removed 1 shared-memory segments"))
      << second.log();
  EXPECT_FALSE(Exists(segment));
  EXPECT_EQ(0, second.Stop(SIGTERM));
  std::remove(config.c_str());
}

TEST(LifecycleTest, InvalidConfigFailsFastNamingTheField) {
  const std::string config = WriteConfig(R"pb(
    pools { name: "x" geometry { mha { num_layers: 2 num_kv_heads: 1 head_dim: 8 } dtype: DTYPE_BF16 }
            page_size: 0 layout: LAYOUT_PAGE_FIRST capacity_tokens: 10 })pb");
  std::string log;
  const int code = testing::DaemonProcess::RunToExit(
      {"--listen=unix:/tmp/hostkv-badconfig.sock", "--config=" + config}, &log);
  EXPECT_NE(0, code);
  EXPECT_NE(std::string::npos, log.find("page_size")) << log;
  EXPECT_NE(std::string::npos, log.find("pools[0]")) << log;
  std::remove(config.c_str());

  const std::string garbage = WriteConfig("pools { nmae: 3 }");
  EXPECT_NE(0, testing::DaemonProcess::RunToExit(
                   {"--listen=unix:/tmp/hostkv-badconfig.sock", "--config=" + garbage},
                   &log));
  std::remove(garbage.c_str());
}

TEST(LifecycleTest, SecondDaemonOnTheSameSocketIsRefused) {
  testing::DaemonProcess first;
  ASSERT_TRUE(first.started()) << first.log();
  std::string log;
  EXPECT_EQ(1, testing::DaemonProcess::RunToExit({"--listen=" + first.target()}, &log));
  EXPECT_NE(std::string::npos, log.find("already serves")) << log;
  EXPECT_OK(Client::Connect(first.target(), "still-there"));
}

TEST(LifecycleTest, BadFlagsExitWithUsageCode) {
  std::string log;
  EXPECT_EQ(2, testing::DaemonProcess::RunToExit(
                   {"--listen=unix:/tmp/hostkv-flags.sock", "--memory_budget=lots"}, &log));
  EXPECT_NE(std::string::npos, log.find("--memory_budget")) << log;
}

// The CUDA backend is optional: on its defaults (--cuda=auto) the daemon
// says which backend it serves; without a GPU it serves the CPU backend,
// refuses CUDA registrations clearly, and --cuda=on refuses to start.
TEST(LifecycleTest, CudaBackendIsOptional) {
  std::string log;
  EXPECT_EQ(2, testing::DaemonProcess::RunToExit(
                   {"--listen=unix:/tmp/hostkv-flags.sock", "--cuda=maybe"}, &log));
  EXPECT_NE(std::string::npos, log.find("--cuda")) << log;

  testing::DaemonProcess daemon({"--config=" + WriteConfig(kConfig)});
  ASSERT_TRUE(daemon.started()) << daemon.log();
  auto client = Client::Connect(daemon.target(), "backend-check").value();
  auto stats = client->GetPoolStats();
  ASSERT_OK(stats);
  ASSERT_GT(stats->pools_size(), 0);
  const bool cuda = daemon.log().find("CUDA backend:") != std::string::npos;
  if (cuda) {
    // A GPU machine: pools are pinned in the background.
    EXPECT_EQ(v1::BACKEND_CUDA, stats->pools(0).backend());
    EXPECT_NE(v1::PIN_NOT_NEEDED, stats->pools(0).pin_state());
    return;
  }
  EXPECT_NE(std::string::npos, daemon.log().find("CPU backend only:"))
      << daemon.log();
  EXPECT_EQ(v1::BACKEND_CPU, stats->pools(0).backend());
  EXPECT_EQ(v1::PIN_NOT_NEEDED, stats->pools(0).pin_state());
  EXPECT_FALSE(stats->pools(0).pinned());
  const std::string pool = stats->pools(0).name();
  auto info = client->GetPool(pool);
  ASSERT_OK(info);
  const uint32_t num_layers =
      info->spec().geometry().has_mha()
          ? info->spec().geometry().mha().num_layers()
          : info->spec().geometry().mla().num_layers();
  v1::DeviceBuffer buffer;
  buffer.set_cuda_ipc_handle(std::string(64, 'h'));
  buffer.set_size(1 << 20);
  const std::vector<v1::DeviceBuffer> k(num_layers, buffer);
  const std::vector<v1::DeviceBuffer> v(
      info->spec().geometry().has_mha() ? num_layers : 0, buffer);
  auto import = client->RegisterDeviceBuffers(pool, 16, k, v);
  EXPECT_EQ(absl::StatusCode::kFailedPrecondition, import.status().code())
      << import.status();
  EXPECT_NE(std::string::npos, import.status().message().find("no CUDA backend"))
      << import.status();

  EXPECT_NE(0, testing::DaemonProcess::RunToExit(
                   {"--listen=unix:/tmp/hostkv-cuda-on.sock", "--cuda=on"}, &log));
  EXPECT_NE(std::string::npos, log.find("--cuda=on")) << log;
}

TEST(LifecycleTest, ClosingASessionFreesItsPages) {
  testing::DaemonProcess daemon({"--config=" + WriteConfig(kConfig)});
  ASSERT_TRUE(daemon.started()) << daemon.log();
  auto observer = Client::Connect(daemon.target(), "observer").value();
  {
    auto engine = Client::Connect(daemon.target(), "engine").value();
    ASSERT_OK(engine->Alloc("llama", 160));
    auto stats = observer->GetPoolStats("llama");
    ASSERT_OK(stats);
    EXPECT_EQ(10u, stats->pools(0).used_pages());
    ASSERT_EQ(1, stats->pools(0).sessions_size());
    EXPECT_EQ("engine", stats->pools(0).sessions(0).client_name());
  }  // ~Client closes the session
  auto stats = observer->GetPoolStats("llama");
  ASSERT_OK(stats);
  EXPECT_EQ(0u, stats->pools(0).used_pages());
  EXPECT_EQ(63u, stats->pools(0).free_pages());
}

// A pool created with delete_with_session goes with its creator's session;
// one that another session still holds pages in stays (and can be deleted
// by its owner later); attaching never marks a pool.
TEST(LifecycleTest, PoolsCreatedWithTheirSessionAreDeletedWithIt) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.started()) << daemon.log();
  auto observer = Client::Connect(daemon.target(), "observer").value();
  v1::PoolSpec spec;
  spec.set_name("private");
  spec.mutable_geometry()->mutable_mha()->set_num_layers(2);
  spec.mutable_geometry()->mutable_mha()->set_num_kv_heads(1);
  spec.mutable_geometry()->mutable_mha()->set_head_dim(8);
  spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  spec.set_page_size(16);
  spec.set_layout(v1::LAYOUT_LAYER_FIRST);
  spec.set_capacity_tokens(64);
  std::vector<PageRange> pages;
  {
    auto engine = Client::Connect(daemon.target(), "engine").value();
    auto pool = engine->CreatePool(spec, true, /*delete_with_session=*/true);
    ASSERT_OK(pool);
    EXPECT_EQ(engine->session_number(), pool->owner().delete_with_session());
    // An attach by another session leaves the mark as it is.
    auto attached = observer->CreatePool(spec, true, true);
    ASSERT_OK(attached);
    EXPECT_EQ(engine->session_number(), attached->owner().delete_with_session());
    ASSERT_OK(engine->Alloc("private", 16));
  }
  EXPECT_ERROR(NotFound, observer->GetPool("private"));
  {
    auto engine = Client::Connect(daemon.target(), "engine").value();
    ASSERT_OK(engine->CreatePool(spec, true, true));
    auto held = observer->Alloc("private", 16);
    ASSERT_OK(held);
    pages = *held;
  }
  // The observer's pages keep it.
  auto kept = observer->GetPool("private");
  ASSERT_OK(kept);
  EXPECT_OK(observer->Free("private", pages));
  EXPECT_OK(observer->DeletePool("private"));
}

TEST(LifecycleTest, OnDaemonLostRunsWhenTheDaemonDiesNotOnClose) {
  testing::DaemonProcess daemon({"--config=" + WriteConfig(kConfig)});
  ASSERT_TRUE(daemon.started()) << daemon.log();
  {
    // A Close of our own is not a loss.
    auto closing = Client::Connect(daemon.target(), "closing").value();
    std::atomic<int> lost{0};
    ASSERT_OK(closing->OnDaemonLost([&] { lost.fetch_add(1); }));
    EXPECT_ERROR(FailedPrecondition, closing->OnDaemonLost([] {}));
    ASSERT_OK(closing->Close());
    EXPECT_EQ(0, lost.load());
  }
  auto engine = Client::Connect(daemon.target(), "engine").value();
  absl::Mutex mu;
  bool lost = false;
  ASSERT_OK(engine->OnDaemonLost([&] {
    absl::MutexLock lock(&mu);
    lost = true;
  }));
  EXPECT_EQ(128 + SIGKILL, daemon.Stop(SIGKILL));
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&lost), absl::Seconds(10)));
}

TEST(LifecycleTest, ConnectToNothingIsUnavailable) {
  EXPECT_ERROR(Unavailable, Client::Connect("unix:/tmp/hostkv-no-such.sock", "x"));
}

}  // namespace
}  // namespace hostkv
