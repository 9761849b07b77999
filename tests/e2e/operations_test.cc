// What an operator sees: /metrics after a known workload, per-pool health,
// flags from the config file and the environment, JSON logs.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "hostkv/client.h"
#include "hostkv/shm_device_buffer.h"
#include "proto/contract/command_ring.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {


// GET /metrics; returns "series{labels}" -> value.
std::map<std::string, double> Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::map<std::string, double> series;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return series;
  }
  const std::string request =
      "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  send(fd, request.data(), request.size(), 0);
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) response.append(buf, n);
  close(fd);
  for (absl::string_view line : absl::StrSplit(response, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(space + 1), &value)) {
      series[std::string(line.substr(0, space))] = value;
    }
  }
  return series;
}

v1::PoolSpec Spec(const std::string& name) {
  v1::PoolSpec spec;
  spec.set_name(name);
  spec.set_layout(v1::LAYOUT_LAYER_FIRST);
  spec.set_page_size(16);
  spec.set_capacity_tokens(1024);
  spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  spec.mutable_geometry()->mutable_mha()->set_num_layers(3);
  spec.mutable_geometry()->mutable_mha()->set_num_kv_heads(2);
  spec.mutable_geometry()->mutable_mha()->set_head_dim(16);
  return spec;
}

TEST(OperationsTest, MetricsCountWhatWasDone) {
  const int port = testing::FreeTcpPort();
  // Pools by name: the labels this test reads are not hashed.
  testing::DaemonProcess daemon({absl::StrCat("--metrics_listen=127.0.0.1:", port),
                                 "--metrics_namespace_names"});
  ASSERT_TRUE(daemon.started()) << daemon.log();
  auto client = Client::Connect(daemon.target(), "workload").value();
  auto pool = client->CreatePool(Spec("p"));
  ASSERT_OK(pool);
  const uint64_t stride = pool->token_stride();  // 64 bytes
  auto device = ShmDeviceBuffer::Create(6 * 128 * stride).value();
  std::vector<v1::DeviceBuffer> k, v;
  for (int l = 0; l < 3; ++l) {
    k.push_back(device.Describe((2 * l) * 128 * stride, 128 * stride));
    v.push_back(device.Describe((2 * l + 1) * 128 * stride, 128 * stride));
  }
  const uint64_t import = client->RegisterDeviceBuffers("p", 128, k, v).value();
  auto pages = client->Alloc("p", 64).value();  // 4 pages
  EXPECT_ERROR(ResourceExhausted, client->Alloc("p", 1024 * 16));
  EXPECT_ERROR(InvalidArgument, client->Alloc("p", 5));
  TransferOptions kernel;
  kernel.mechanism = v1::MECHANISM_KERNEL;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(client->Wait(client->Backup("p", import, pages, {{0, 64}}).value()));
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK(client->Wait(client->Load("p", import, pages, {{64, 64}}, kernel).value()));
  }
  const double op_bytes = 64.0 * 2 * 3 * stride;  // tokens x K/V x layers x row

  auto m = Scrape(port);
  ASSERT_FALSE(m.empty()) << daemon.log();
  EXPECT_EQ(3, (m[R"(hostkv_transfer_operations_total{direction="backup",mechanism="direct"})"]));
  EXPECT_EQ(2, (m[R"(hostkv_transfer_operations_total{direction="load",mechanism="kernel"})"]));
  EXPECT_EQ(3 * op_bytes, (m[R"(hostkv_transfer_bytes_total{direction="backup",mechanism="direct"})"]));
  EXPECT_EQ(2 * op_bytes, (m[R"(hostkv_transfer_bytes_total{direction="load",mechanism="kernel"})"]));
  EXPECT_EQ(9, (m[R"(hostkv_layer_ready_seconds_count{direction="backup"})"]));
  EXPECT_EQ(6, (m[R"(hostkv_layer_ready_seconds_count{direction="load"})"]));
  EXPECT_EQ(1, (m[R"(hostkv_alloc_failures_total{reason="pool_full"})"]));
  EXPECT_EQ(1, (m[R"(hostkv_alloc_failures_total{reason="bad_size"})"]));
  EXPECT_EQ(1, (m[R"(hostkv_rpcs_total{code="OK",method="Alloc"})"]));
  EXPECT_EQ(1, (m[R"(hostkv_rpcs_total{code="RESOURCE_EXHAUSTED",method="Alloc"})"]));
  EXPECT_EQ(1, (m[R"(hostkv_rpcs_total{code="INVALID_ARGUMENT",method="Alloc"})"]));
  EXPECT_EQ(3, (m[R"(hostkv_rpcs_total{code="OK",method="Backup"})"]));
  EXPECT_EQ(4, (m[R"(hostkv_pool_used_pages{pool="p"})"]));
  EXPECT_EQ(65, (m[R"(hostkv_pool_capacity_pages{pool="p"})"]));
  EXPECT_EQ(4 * 16 * 2 * 3 * stride, (m[R"(hostkv_pool_used_bytes{pool="p"})"]));
  EXPECT_EQ(1, (m[R"(hostkv_pool_imports{pool="p"})"]));
  EXPECT_EQ(1, m["hostkv_sessions"]);
  EXPECT_EQ(1, m["hostkv_sessions_attached"]);
  EXPECT_EQ(0, m["hostkv_operations_in_flight"]);
  // The pool, its page cache's metadata, its ledger, the session's signal records
  // (256 x 64 bytes) and its command ring's segment.
  auto stats = client->GetPoolStats("p");
  ASSERT_OK(stats);
  ASSERT_EQ(1, stats->pools_size());
  EXPECT_LT(0u, stats->pools(0).cache_reserved_bytes());
  EXPECT_LT(0u, stats->pools(0).ledger_reserved_bytes());  // --keep_state
  EXPECT_EQ(pool->total_bytes() + stats->pools(0).cache_reserved_bytes() +
                stats->pools(0).ledger_reserved_bytes() + 256 * 64 +
                (client->CommandRingCalls() >= 0
                     ? RingSegmentBytes(kRingSlots, kRingSlotBytes)
                     : 0),
            m["hostkv_memory_reserved_bytes"]);
  ASSERT_OK(client->Close());
  m = Scrape(port);
  EXPECT_EQ(0, (m[R"(hostkv_pool_used_pages{pool="p"})"]));
  EXPECT_EQ(1, (m[R"(hostkv_sessions_ended_total{reason="closed"})"]));
}

TEST(OperationsTest, EachPoolHasItsHealth) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.started()) << daemon.log();
  EXPECT_TRUE(CheckHealth(daemon.target()).value());
  EXPECT_TRUE(CheckHealth(daemon.target(), "hostkv.v1.HostKV").value());
  EXPECT_ERROR(NotFound, CheckHealth(daemon.target(), "hostkv.pool.p"));
  auto client = Client::Connect(daemon.target(), "ops").value();
  ASSERT_OK(client->CreatePool(Spec("p")));
  EXPECT_TRUE(CheckHealth(daemon.target(), "hostkv.pool.p").value());
  ASSERT_OK(client->DeletePool("p"));
  EXPECT_FALSE(CheckHealth(daemon.target(), "hostkv.pool.p").value());
}

std::string WriteFile(const std::string& text) {
  char path[] = "/tmp/hostkv-ops-XXXXXX";
  close(mkstemp(path));
  std::ofstream(path) << text;
  return path;
}

// The budget that won: a 3-layer pool of 1024 tokens needs ~197 KiB.
absl::StatusCode CreateUnderBudget(const std::vector<std::string>& args) {
  testing::DaemonProcess daemon(args);
  EXPECT_TRUE(daemon.started()) << daemon.log();
  auto client = Client::Connect(daemon.target(), "ops");
  if (!client.ok()) return client.status().code();
  return (*client)->CreatePool(Spec("p")).status().code();
}

TEST(OperationsTest, FlagsComeFromConfigThenEnvironmentThenCommandLine) {
  const std::string small = WriteFile(R"pb(flags { key: "memory_budget" value: "64KiB" })pb");
  EXPECT_EQ(absl::StatusCode::kResourceExhausted,
            CreateUnderBudget({"--config=" + small}));
  setenv("HOSTKVD_MEMORY_BUDGET", "1MiB", 1);
  EXPECT_EQ(absl::StatusCode::kOk, CreateUnderBudget({"--config=" + small}));
  EXPECT_EQ(absl::StatusCode::kResourceExhausted,
            CreateUnderBudget({"--config=" + small, "--memory_budget=100KiB"}));
  unsetenv("HOSTKVD_MEMORY_BUDGET");
  std::remove(small.c_str());

  const std::string typo = WriteFile(R"pb(flags { key: "memory_budgte" value: "1" })pb");
  std::string log;
  EXPECT_NE(0, testing::DaemonProcess::RunToExit(
                   {"--listen=unix:/tmp/hostkv-ops-typo.sock", "--config=" + typo}, &log));
  EXPECT_NE(std::string::npos, log.find("memory_budgte")) << log;
  std::remove(typo.c_str());
}

TEST(OperationsTest, JsonLogsAreOneObjectPerLine) {
  testing::DaemonProcess daemon({"--log_format=json"});
  ASSERT_TRUE(daemon.started()) << daemon.log();
  ASSERT_OK(Client::Connect(daemon.target(), "quote\"name"));
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(daemon.log(), '\n', absl::SkipEmpty())) {
    ++lines;
    EXPECT_TRUE(absl::StartsWith(line, "{\"time\":\"") && absl::EndsWith(line, "\"}"))
        << line;
  }
  EXPECT_GE(lines, 2);
  EXPECT_NE(std::string::npos, daemon.log().find(R"(client='quote\"name')"));
}

}  // namespace
}  // namespace hostkv
