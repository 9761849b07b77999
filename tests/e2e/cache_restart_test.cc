// A warm restart against the real daemon: an engine process backs its KV up,
// publishes the pages (without waiting for the backup: the publish waits) and
// is SIGKILLed; its successor finds every key, loads the pages into its own
// device buffers and gets the same bytes; a third engine shares them.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
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

constexpr uint32_t kLayers = 3;
constexpr uint32_t kPageSize = 16;
constexpr uint64_t kPages = 8;
constexpr uint64_t kSlots = 256;  // device rows per buffer

v1::PoolSpec Spec() {
  v1::PoolSpec spec;
  spec.set_name("warm");
  spec.set_layout(v1::LAYOUT_PAGE_FIRST);
  spec.set_page_size(kPageSize);
  spec.set_capacity_tokens(64 * kPageSize);
  spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  spec.mutable_geometry()->mutable_mha()->set_num_layers(kLayers);
  spec.mutable_geometry()->mutable_mha()->set_num_kv_heads(2);
  spec.mutable_geometry()->mutable_mha()->set_head_dim(16);
  return spec;
}

std::vector<std::string> Keys() {
  std::vector<std::string> keys;
  for (uint64_t i = 0; i < kPages; ++i) keys.push_back(absl::StrCat("prefix-page-", i));
  return keys;
}

std::vector<uint64_t> Flatten(const std::vector<PageRange>& runs) {
  std::vector<uint64_t> pages;
  for (const PageRange& r : runs) {
    for (uint64_t i = 0; i < r.num_pages; ++i) pages.push_back(r.first_page + i);
  }
  return pages;
}

uint8_t Pattern(uint32_t buffer, uint64_t row, uint64_t i) {
  return static_cast<uint8_t>(buffer * 37 + row * 11 + i * 3 + 1);
}

// An engine's device KV pool on the CPU backend: K and V of every layer in
// one sealed memfd, registered with the daemon.
struct Engine {
  std::unique_ptr<Client> client;
  std::optional<ShmDeviceBuffer> device;
  uint64_t import = 0;
  uint64_t stride = 0;

  static absl::StatusOr<Engine> Start(const std::string& target,
                                      const std::string& name) {
    Engine e;
    ASSIGN_OR_RETURN(e.client, Client::Connect(target, name));
    ASSIGN_OR_RETURN(v1::Pool pool, e.client->CreatePool(Spec(), true));
    e.stride = pool.token_stride();
    ASSIGN_OR_RETURN(ShmDeviceBuffer device,
                     ShmDeviceBuffer::CreateSealed(2 * kLayers * kSlots * e.stride));
    e.device.emplace(std::move(device));
    ASSIGN_OR_RETURN(const uint64_t handle,
                     e.client->PassDescriptor(e.device->fd()));
    std::vector<v1::DeviceBuffer> k, v;
    for (uint32_t l = 0; l < kLayers; ++l) {
      k.push_back(ShmDeviceBuffer::DescribePassed(handle, (2 * l) * kSlots * e.stride,
                                                  kSlots * e.stride));
      v.push_back(ShmDeviceBuffer::DescribePassed(
          handle, (2 * l + 1) * kSlots * e.stride, kSlots * e.stride));
    }
    ASSIGN_OR_RETURN(e.import, e.client->RegisterDeviceBuffers("warm", kSlots, k, v));
    return e;
  }
  uint8_t* Row(uint32_t buffer, uint64_t row) const {
    return device->data() + (buffer * kSlots + row) * stride;
  }
  void Fill(uint64_t first_row, uint64_t rows) {
    for (uint32_t b = 0; b < 2 * kLayers; ++b) {
      for (uint64_t r = 0; r < rows; ++r) {
        for (uint64_t i = 0; i < stride; ++i) Row(b, first_row + r)[i] = Pattern(b, r, i);
      }
    }
  }
  // Rows [first_row, +rows) hold the pattern Fill wrote from row 0.
  bool Holds(uint64_t first_row, uint64_t rows) const {
    for (uint32_t b = 0; b < 2 * kLayers; ++b) {
      for (uint64_t r = 0; r < rows; ++r) {
        for (uint64_t i = 0; i < stride; ++i) {
          if (Row(b, first_row + r)[i] != Pattern(b, r, i)) return false;
        }
      }
    }
    return true;
  }
};

// Engine 1, in a child process: backs its KV up, publishes it, says so on
// `ready`, and waits to be killed.
[[noreturn]] void RunWriter(const std::string& target, int ready) {
  auto engine = Engine::Start(target, "engine-1");
  if (!engine.ok()) _exit(2);
  engine->Fill(0, kPages * kPageSize);
  auto pages = engine->client->Alloc("warm", kPages * kPageSize);
  if (!pages.ok()) _exit(3);
  auto op = engine->client->Backup("warm", engine->import, *pages,
                                   {{0, kPages * kPageSize}});
  if (!op.ok()) _exit(4);
  // Published without waiting: the publish waits for the backup.
  std::vector<CacheItem> items;
  uint64_t i = 0;
  const std::vector<std::string> keys = Keys();
  for (const PageRange& run : *pages) {
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p, ++i) {
      items.push_back({keys[i], i == 0 ? "" : keys[i - 1], p});
    }
  }
  auto published = engine->client->Publish("warm", "model-x/tp0", items);
  if (!published.ok() || published->cached != kPages) _exit(5);
  const char ok = 'k';
  if (write(ready, &ok, 1) != 1) _exit(6);
  for (;;) pause();
}

TEST(CacheE2eTest, AKilledEnginesSuccessorLoadsItsPublishedPages) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.started()) << daemon.log();
  int fds[2];
  ASSERT_EQ(0, pipe(fds));
  const pid_t writer = fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    close(fds[0]);
    RunWriter(daemon.target(), fds[1]);
  }
  close(fds[1]);
  char ok = 0;
  ASSERT_EQ(1, read(fds[0], &ok, 1)) << daemon.log();
  close(fds[0]);
  ASSERT_EQ(0, kill(writer, SIGKILL));
  int status = 0;
  ASSERT_EQ(writer, waitpid(writer, &status, 0));

  auto successor = Engine::Start(daemon.target(), "engine-2");
  ASSERT_OK(successor);
  // The writer's session ends when the daemon sees its socket close.
  for (int i = 0; i < 500; ++i) {
    auto stats = successor->client->GetPoolStats("warm");
    ASSERT_OK(stats);
    if (stats->open_sessions() == 1) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  auto found = successor->client->Lookup("warm", "model-x/tp0", Keys(), true);
  ASSERT_OK(found);
  EXPECT_EQ(kPages, found->hits);
  auto op = successor->client->Load("warm", successor->import, found->pages,
                                    {{kSlots - kPages * kPageSize, kPages * kPageSize}});
  ASSERT_OK(op);
  ASSERT_OK(successor->client->WaitLayer(*op, 0));
  ASSERT_OK(successor->client->Wait(*op));
  EXPECT_TRUE(successor->Holds(kSlots - kPages * kPageSize, kPages * kPageSize));

  // A second live engine shares the same pages.
  auto other = Engine::Start(daemon.target(), "engine-3");
  ASSERT_OK(other);
  auto shared = other->client->Lookup("warm", "model-x/tp0", Keys(), true);
  ASSERT_OK(shared);
  EXPECT_EQ(Flatten(found->pages), Flatten(shared->pages));
  auto op2 = other->client->Load("warm", other->import, shared->pages,
                                 {{0, kPages * kPageSize}});
  ASSERT_OK(op2);
  ASSERT_OK(other->client->Wait(*op2));
  EXPECT_TRUE(other->Holds(0, kPages * kPageSize));
  auto stats = other->client->GetPoolStats("warm");
  ASSERT_OK(stats);
  EXPECT_EQ(kPages, stats->pools(0).cached_pages());
  EXPECT_EQ(kPages, stats->pools(0).cache().referenced_pages());
  ASSERT_OK(successor->client->Close());
  ASSERT_OK(other->client->Close());
}

}  // namespace
}  // namespace hostkv
