// hostkvd killed (-9) or replaced (--takeover) under a C++ engine: the
// client library waits for the next daemon, resumes its session and
// registers its buffers again, so the engine's next calls succeed and its
// host pages, imports and published keys are as before (server/README.md "While
// hostkvd is away", deploy/README.md "Restarts and upgrades").
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "hostkv/client.h"
#include "hostkv/shm_device_buffer.h"
#include "proto/contract/status_macros.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr uint32_t kLayers = 2;
constexpr uint32_t kPageSize = 8;
constexpr uint64_t kPages = 6;
constexpr uint64_t kSlots = 64;

v1::PoolSpec Spec() {
  v1::PoolSpec spec;
  spec.set_name("kept");
  spec.set_layout(v1::LAYOUT_LAYER_FIRST);
  spec.set_page_size(kPageSize);
  spec.set_capacity_tokens(32 * kPageSize);
  spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  spec.mutable_geometry()->mutable_mha()->set_num_layers(kLayers);
  spec.mutable_geometry()->mutable_mha()->set_num_kv_heads(1);
  spec.mutable_geometry()->mutable_mha()->set_head_dim(16);
  return spec;
}

// An engine on the CPU backend: its K and V buffers in one passed memfd.
struct Engine {
  std::unique_ptr<Client> client;
  std::optional<ShmDeviceBuffer> device;
  uint64_t import = 0;
  uint64_t bytes = 0;  // of the device buffer

  absl::Status Start(const std::string& target, absl::Duration reconnect) {
    ConnectOptions options;
    options.reconnect_timeout = reconnect;
    ASSIGN_OR_RETURN(client, Client::Connect(target, "engine", options));
    ASSIGN_OR_RETURN(v1::Pool pool, client->CreatePool(Spec(), true));
    const uint64_t buffer = kSlots * pool.token_stride();
    bytes = 2 * kLayers * buffer;
    ASSIGN_OR_RETURN(ShmDeviceBuffer made, ShmDeviceBuffer::CreateSealed(bytes));
    device.emplace(std::move(made));
    ASSIGN_OR_RETURN(const uint64_t handle, client->PassDescriptor(device->fd()));
    std::vector<v1::DeviceBuffer> k, v;
    for (uint32_t l = 0; l < kLayers; ++l) {
      k.push_back(ShmDeviceBuffer::DescribePassed(handle, 2 * l * buffer, buffer));
      v.push_back(ShmDeviceBuffer::DescribePassed(handle, (2 * l + 1) * buffer, buffer));
    }
    ASSIGN_OR_RETURN(import, client->RegisterDeviceBuffers("kept", kSlots, k, v));
    return absl::OkStatus();
  }
  void Fill(uint8_t seed) {
    for (uint64_t i = 0; i < bytes; ++i) device->data()[i] = static_cast<uint8_t>(seed + i * 7);
  }
  std::string Bytes() const {
    return std::string(reinterpret_cast<const char*>(device->data()), bytes);
  }
  // Fills the device buffer from `seed`, backs rows [0, pages) up to new
  // host pages and waits; returns the pages.
  absl::StatusOr<std::vector<PageRange>> BackedUpPages(uint8_t seed);
};

const std::vector<SlotRange> kRows = {{0, kPages * kPageSize}};

absl::StatusOr<std::vector<PageRange>> Engine::BackedUpPages(uint8_t seed) {
  Fill(seed);
  ASSIGN_OR_RETURN(std::vector<PageRange> pages,
                   client->Alloc("kept", kPages * kPageSize));
  ASSIGN_OR_RETURN(Operation backup, client->Backup("kept", import, pages, kRows));
  RETURN_IF_ERROR(client->Wait(backup));
  return pages;
}

TEST(DaemonRestartTest, TheEngineCarriesOnWithItsPagesImportAndKeys) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.started()) << daemon.log();
  Engine e;
  ASSERT_OK(e.Start(daemon.target(), absl::Seconds(20)));
  absl::StatusOr<std::vector<PageRange>> pages = e.BackedUpPages(3);
  ASSERT_OK(pages);
  const std::string device_before = e.Bytes();
  absl::StatusOr<std::string> host_before = e.client->ReadPages("kept", *pages);
  ASSERT_OK(host_before);
  // Half the pages published: page i under "key-i".
  std::vector<CacheItem> items;
  std::vector<std::string> keys;
  std::vector<PageRange> rest;
  const uint64_t first = (*pages)[0].first_page;
  ASSERT_EQ((*pages)[0].num_pages, kPages);
  for (uint64_t i = 0; i < kPages / 2; ++i) {
    keys.push_back(absl::StrCat("key-", i));
    items.push_back({keys.back(), i == 0 ? "" : keys[i - 1], first + i});
  }
  ASSERT_OK(e.client->Publish("kept", "ns", items));
  const std::vector<PageRange> owned = {{first + kPages / 2, kPages / 2}};
  absl::StatusOr<std::string> owned_before = e.client->ReadPages("kept", owned);
  ASSERT_OK(owned_before);
  absl::StatusOr<Operation> in_flight =
      e.client->Load("kept", e.import, owned, {{0, kPages / 2 * kPageSize}});
  ASSERT_OK(in_flight);

  ASSERT_EQ(daemon.Stop(SIGKILL), 128 + SIGKILL);
  ASSERT_TRUE(daemon.Restart()) << daemon.log();

  // The next call resumes the session: the same pages, the same bytes.
  absl::StatusOr<std::string> owned_after = e.client->ReadPages("kept", owned);
  ASSERT_OK(owned_after);
  EXPECT_EQ(*owned_after, *owned_before);
  EXPECT_NE(daemon.log().find("resumed after the restart"), std::string::npos)
      << daemon.log();
  // An operation of the daemon before: finished there, or submitted again
  // by the resume; either way done once Wait returns.
  EXPECT_OK(e.client->Wait(*in_flight));
  // The import keeps its id: a load into the zeroed device buffer.
  std::memset(e.device->data(), 0, e.bytes);
  absl::StatusOr<Operation> load = e.client->Load("kept", e.import, owned, {{0, kPages / 2 * kPageSize}});
  ASSERT_OK(load);
  ASSERT_OK(e.client->Wait(*load));
  const uint64_t half = e.bytes / (2 * kLayers);  // one buffer
  const uint64_t stride = half / kSlots;
  const uint64_t first_owned_row = kPages / 2 * kPageSize;
  for (uint32_t b = 0; b < 2 * kLayers; ++b) {
    EXPECT_EQ(0, std::memcmp(e.device->data() + b * half,
                             device_before.data() + b * half + first_owned_row * stride,
                             kPages / 2 * kPageSize * stride))
        << "buffer " << b;
  }
  // The keys: found by another engine, with the bytes published.
  absl::StatusOr<std::unique_ptr<Client>> other = Client::Connect(daemon.target(), "other");
  ASSERT_OK(other);
  absl::StatusOr<LookupResult> found = (*other)->Lookup("kept", "ns", keys, true);
  ASSERT_OK(found);
  EXPECT_EQ(found->hits, kPages / 2);
  absl::StatusOr<std::string> cached = (*other)->ReadPages("kept", found->pages);
  ASSERT_OK(cached);
  EXPECT_EQ(*cached, host_before->substr(0, cached->size()));
  absl::StatusOr<v1::GetPoolStatsResponse> stats = (*other)->GetPoolStats("kept");
  ASSERT_OK(stats);
  EXPECT_TRUE(stats->restart().adopted());
  EXPECT_EQ(stats->restart().pages_adopted(), kPages / 2);
  EXPECT_EQ(stats->restart().cached_pages_adopted(), kPages / 2);
  EXPECT_EQ(stats->restart().sessions_resumed(), 1u);
}

// The rows a load of `pages` (pages [first, first + n) of the device rows
// `device_before`, backed up from rows 0..) put at device row 0.
bool LoadedRowsMatch(const Engine& e, const std::string& device_before,
                     uint64_t rows) {
  const uint64_t half = e.bytes / (2 * kLayers);  // one buffer
  for (uint32_t b = 0; b < 2 * kLayers; ++b) {
    if (std::memcmp(e.device->data() + b * half, device_before.data() + b * half,
                    rows * (half / kSlots)) != 0) {
      return false;
    }
  }
  return true;
}

// A load sent while hostkvd is down reaches the next daemon (the client
// resumes and sends it again) and is waited for in that daemon's records:
// Wait returns once its rows are there, not before.
TEST(DaemonRestartTest, ALoadSentWhileTheDaemonIsDownIsWaitedForInTheNextOne) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.started()) << daemon.log();
  Engine e;
  ASSERT_OK(e.Start(daemon.target(), absl::Seconds(20)));
  absl::StatusOr<std::vector<PageRange>> pages = e.BackedUpPages(5);
  ASSERT_OK(pages);
  const std::string device_before = e.Bytes();
  for (int round = 0; round < 3; ++round) {
    std::memset(e.device->data(), 0, e.bytes);
    ASSERT_EQ(daemon.Stop(SIGKILL), 128 + SIGKILL);
    // The engine's thread loads while the daemon is down (the daemon is
    // started from this thread: it dies with the thread that started it).
    absl::Status waited = absl::UnknownError("not run");
    bool rows_right = false;
    std::thread engine([&] {
      absl::StatusOr<Operation> load = e.client->Load("kept", e.import, *pages, kRows);
      waited = load.ok() ? e.client->Wait(*load) : load.status();
      rows_right = LoadedRowsMatch(e, device_before, kPages * kPageSize);
    });
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_TRUE(daemon.Restart()) << daemon.log();
    engine.join();
    ASSERT_OK(waited);
    EXPECT_TRUE(rows_right) << "round " << round;
  }
  // No copy in flight is left on the pages.
  EXPECT_OK(e.client->Free("kept", *pages));
}

// References on cached pages do not survive the daemon; the resume takes
// them again (the keys are still on their pages), so a Load and a Release
// of pages looked up before the restart work after it.
TEST(DaemonRestartTest, ReferencesHeldBeforeTheRestartAreTakenAgain) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.started()) << daemon.log();
  Engine e;
  ASSERT_OK(e.Start(daemon.target(), absl::Seconds(20)));
  absl::StatusOr<std::vector<PageRange>> pages = e.BackedUpPages(9);
  ASSERT_OK(pages);
  const std::string device_before = e.Bytes();
  std::vector<CacheItem> items;
  std::vector<std::string> keys;
  for (uint64_t i = 0; i < kPages; ++i) keys.push_back(absl::StrCat("held-", i));
  for (uint64_t i = 0; i < kPages; ++i) {
    items.push_back({keys[i], i == 0 ? "" : keys[i - 1], (*pages)[0].first_page + i});
  }
  ASSERT_OK(e.client->Publish("kept", "ns", items));
  absl::StatusOr<LookupResult> found = e.client->Lookup("kept", "ns", keys, true);
  ASSERT_OK(found);
  ASSERT_EQ(found->hits, kPages);

  ASSERT_EQ(daemon.Stop(SIGKILL), 128 + SIGKILL);
  ASSERT_TRUE(daemon.Restart()) << daemon.log();

  std::memset(e.device->data(), 0, e.bytes);
  absl::StatusOr<Operation> load = e.client->Load("kept", e.import, found->pages, kRows);
  ASSERT_OK(load);
  ASSERT_OK(e.client->Wait(*load));
  EXPECT_TRUE(LoadedRowsMatch(e, device_before, kPages * kPageSize));
  absl::StatusOr<uint64_t> released = e.client->Release("kept", found->pages);
  ASSERT_OK(released);
  EXPECT_EQ(*released, kPages);
  EXPECT_ERROR(FailedPrecondition, e.client->Release("kept", found->pages));
}

TEST(DaemonRestartTest, ADaemonWithoutTheStateSaysTheSessionIsLost) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.started()) << daemon.log();
  Engine e;
  ASSERT_OK(e.Start(daemon.target(), absl::Seconds(20)));
  ASSERT_EQ(daemon.Stop(SIGKILL), 128 + SIGKILL);
  ASSERT_TRUE(daemon.Restart({"--discard_state"})) << daemon.log();
  absl::StatusOr<std::vector<PageRange>> pages = e.client->Alloc("kept", kPageSize);
  EXPECT_FALSE(pages.ok());
  EXPECT_NE(pages.status().message().find("no open session"), std::string::npos)
      << pages.status();
}

// A configured pool whose spec changed since the state was written: the
// daemon refuses to start, naming --discard_state, and starts with it.
TEST(DaemonRestartTest, AStateOfAnotherGeometryIsRefusedThenDiscarded) {
  char tmpl[] = "/tmp/hostkv-e2e-geometry-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string config = dir + "/hostkvd.textproto";
  auto write_config = [&](int pages) {
    FILE* f = std::fopen(config.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f,
                 "pools { name: \"kept\" page_size: 8 capacity_tokens: %d "
                 "layout: LAYOUT_LAYER_FIRST geometry { dtype: DTYPE_BF16 "
                 "mha { num_layers: 2 num_kv_heads: 1 head_dim: 16 } } }\n",
                 pages * 8);
    std::fclose(f);
  };
  write_config(32);
  {
    testing::DaemonProcess daemon({"--config=" + config});
    ASSERT_TRUE(daemon.started()) << daemon.log();
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(daemon.target(), "e");
    ASSERT_OK(c);
    ASSERT_OK((*c)->Alloc("kept", 8));
    ASSERT_EQ(daemon.Stop(SIGKILL), 128 + SIGKILL);
    write_config(48);
    std::string log;
    const std::vector<std::string> args = {"--listen=" + daemon.target(),
                                           "--memory_reserve=256MiB",
                                           "--config=" + config};
    EXPECT_EQ(testing::DaemonProcess::RunToExit(args, &log), 1);
    EXPECT_NE(log.find("differs from the pool of that name the previous hostkvd left"),
              std::string::npos) << log;
    EXPECT_NE(log.find("--discard_state"), std::string::npos) << log;
    // The state is still there: the old configuration adopts it.
    write_config(32);
    ASSERT_TRUE(daemon.Restart()) << daemon.log();
    EXPECT_NE(daemon.log().find("1 sessions waiting for their resume"), std::string::npos)
        << daemon.log();
    ASSERT_EQ(daemon.Stop(SIGKILL), 128 + SIGKILL);
    write_config(48);
    ASSERT_TRUE(daemon.Restart({"--discard_state"})) << daemon.log();
    absl::StatusOr<std::unique_ptr<Client>> fresh = Client::Connect(daemon.target(), "f");
    ASSERT_OK(fresh);
    absl::StatusOr<v1::Pool> pool = (*fresh)->GetPool("kept");
    ASSERT_OK(pool);
    EXPECT_EQ(pool->spec().capacity_tokens(), 48u * 8);
  }
  std::system(("rm -rf " + dir).c_str());
}

TEST(DaemonRestartTest, TakeoverUnderTrafficFailsNoCall) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.started()) << daemon.log();
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::atomic<int64_t> longest_ns{0};
  std::atomic<int> calls{0};
  auto traffic = [&](int n) {
    ConnectOptions options;
    options.reconnect_timeout = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<Client>> c =
        Client::Connect(daemon.target(), absl::StrCat("traffic-", n), options);
    if (!c.ok() || !(*c)->CreatePool(Spec(), true).ok()) {
      ++failures;
      return;
    }
    const std::string data(2 * kLayers * kPageSize * 2 * 16, static_cast<char>('a' + n));
    while (!stop.load()) {
      const absl::Time start = absl::Now();
      absl::StatusOr<std::vector<PageRange>> p = (*c)->Alloc("kept", kPageSize);
      bool ok = p.ok();
      if (ok) ok = (*c)->WritePages("kept", *p, data).ok();
      absl::StatusOr<std::string> back =
          ok ? (*c)->ReadPages("kept", *p) : absl::StatusOr<std::string>("");
      ok = ok && back.ok() && *back == data;
      if (p.ok()) ok = (*c)->Free("kept", *p).ok() && ok;
      if (!ok) {
        ++failures;
        ADD_FAILURE() << "client " << n << ": "
                      << (p.ok() ? back.status() : p.status());
      }
      ++calls;
      const int64_t took = absl::ToInt64Nanoseconds(absl::Now() - start);
      int64_t seen = longest_ns.load();
      while (took > seen && !longest_ns.compare_exchange_weak(seen, took)) {
      }
    }
  };
  std::thread a(traffic, 0), b(traffic, 1);
  absl::SleepFor(absl::Seconds(3));
  const int before = calls.load();
  testing::DaemonProcess next({"--takeover"}, daemon.target());
  EXPECT_TRUE(next.started()) << next.log();
  absl::SleepFor(absl::Seconds(7));
  stop = true;
  a.join();
  b.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(calls.load(), before + 10) << "traffic went on after the takeover";
  EXPECT_NE(next.log().find("took over from pid"), std::string::npos) << next.log();
  EXPECT_EQ(daemon.Stop(SIGTERM, 5000), 0) << "the old daemon drained and exited";
  RecordProperty("longest_cycle_ms", static_cast<int>(longest_ns.load() / 1000000));
  std::printf("takeover: %d cycles, the longest %.1f ms\n", calls.load(),
              longest_ns.load() / 1e6);
}

}  // namespace
}  // namespace hostkv
