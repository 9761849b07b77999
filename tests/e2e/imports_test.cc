// Device buffers as sealed memfds passed over the session socket, and the
// per-session and per-user limits on imports, pools and sessions.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hostkv/client.h"
#include "hostkv/shm_device_buffer.h"
#include "proto/contract/shm_segment.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr uint32_t kLayers = 2;
constexpr uint32_t kPageSize = 16;
constexpr uint64_t kStride = 2 * 16 * 2;  // 2 heads x 16 x fp16
constexpr uint64_t kSlots = 128;
constexpr uint64_t kLayerBytes = kSlots * kStride;

v1::PoolSpec Spec(const std::string& name) {
  v1::PoolSpec spec;
  spec.set_name(name);
  spec.set_layout(v1::LAYOUT_PAGE_FIRST);
  spec.set_page_size(kPageSize);
  spec.set_capacity_tokens(1024);
  spec.mutable_geometry()->set_dtype(v1::DTYPE_FP16);
  spec.mutable_geometry()->mutable_mha()->set_num_layers(kLayers);
  spec.mutable_geometry()->mutable_mha()->set_num_kv_heads(2);
  spec.mutable_geometry()->mutable_mha()->set_head_dim(16);
  return spec;
}

// K and V of every layer, laid out one after another in one buffer that the
// daemon knows by `handle`.
void Describe(uint64_t handle, std::vector<v1::DeviceBuffer>* k,
              std::vector<v1::DeviceBuffer>* v) {
  for (uint32_t l = 0; l < kLayers; ++l) {
    k->push_back(ShmDeviceBuffer::DescribePassed(handle, (2 * l) * kLayerBytes,
                                                 kLayerBytes));
    v->push_back(ShmDeviceBuffer::DescribePassed(
        handle, (2 * l + 1) * kLayerBytes, kLayerBytes));
  }
}

TEST(ImportsTest, SealedMemfdRoundTripIsByteExact) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.started()) << daemon.log();
  auto client = std::move(Client::Connect(daemon.target(), "engine").value());
  ASSERT_OK(client->CreatePool(Spec("p")));
  auto device = ShmDeviceBuffer::CreateSealed(2 * kLayers * kLayerBytes);
  ASSERT_OK(device);
  auto handle = client->PassDescriptor(device->fd());
  ASSERT_OK(handle);
  std::vector<v1::DeviceBuffer> k, v;
  Describe(*handle, &k, &v);
  auto import = client->RegisterDeviceBuffers("p", kSlots, k, v);
  ASSERT_OK(import);
  for (uint64_t i = 0; i < device->size(); ++i)
    device->data()[i] = static_cast<uint8_t>(i * 7 + 3);
  const std::string before(reinterpret_cast<const char*>(device->data()),
                           device->size());
  auto pages = client->Alloc("p", kSlots);
  ASSERT_OK(pages);
  auto backup = client->Backup("p", *import, *pages, {{0, kSlots}});
  ASSERT_OK(backup);
  ASSERT_OK(client->Wait(*backup));
  std::memset(device->data(), 0, device->size());
  auto load = client->Load("p", *import, *pages, {{0, kSlots}});
  ASSERT_OK(load);
  ASSERT_OK(client->Wait(*load));
  EXPECT_EQ(0, std::memcmp(before.data(), device->data(), before.size()));
}

// kFetchKvWord over a real session socket: only CUDA imports with
// gpu_signals have a KV-written page (the CUDA side is in tests/gpu/), and a
// refused fetch leaves the connection -- and the session -- usable.
TEST(ImportsTest, KvWordIsFetchedOnlyForGpuSignalImports) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.started()) << daemon.log();
  auto client = std::move(Client::Connect(daemon.target(), "engine").value());
  ASSERT_OK(client->CreatePool(Spec("p")));
  auto device = ShmDeviceBuffer::CreateSealed(2 * kLayers * kLayerBytes);
  ASSERT_OK(device);
  auto handle = client->PassDescriptor(device->fd());
  ASSERT_OK(handle);
  std::vector<v1::DeviceBuffer> k, v;
  Describe(*handle, &k, &v);
  auto import = client->RegisterDeviceBuffers("p", kSlots, k, v);
  ASSERT_OK(import);
  EXPECT_ERROR(FailedPrecondition, client->FetchKvWord(*import));
  EXPECT_ERROR(NotFound, client->FetchKvWord(*import + 1000));
  // Still one session on a working socket.
  EXPECT_OK(client->PassDescriptor(device->fd()));
  auto pages = client->Alloc("p", kSlots);
  ASSERT_OK(pages);
  auto backup = client->Backup("p", *import, *pages, {{0, kSlots}});
  ASSERT_OK(backup);
  EXPECT_OK(client->Wait(*backup));
  ASSERT_OK(client->UnregisterDeviceBuffers(*import));
  EXPECT_ERROR(NotFound, client->FetchKvWord(*import));
}

// kFetchPoolSegment for the pool's owner: a read-write descriptor of the
// very pages the daemon serves (bytes written through it come back from
// ReadPages); over a connection without a session it is refused.
TEST(ImportsTest, OwnerMapsItsPoolSegmentReadWrite) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.started()) << daemon.log();
  auto client = std::move(Client::Connect(daemon.target(), "engine").value());
  auto pool = client->CreatePool(Spec("p"));
  ASSERT_OK(pool);
  EXPECT_ERROR(NotFound, client->FetchPoolSegment("absent"));
  EXPECT_ERROR(InvalidArgument, client->FetchPoolSegment(""));
  auto segment = client->FetchPoolSegment("p");
  ASSERT_OK(segment);
  ScopedFd fd(segment->fd);
  EXPECT_TRUE(segment->writable);
  auto* base = static_cast<uint8_t*>(mmap(nullptr, pool->total_bytes(),
                                          PROT_READ | PROT_WRITE, MAP_SHARED,
                                          fd.get(), 0));
  ASSERT_NE(MAP_FAILED, static_cast<void*>(base));
  auto pages = client->Alloc("p", kPageSize);
  ASSERT_OK(pages);
  auto meta = client->GetPageBufferMeta("p", *pages);
  ASSERT_OK(meta);
  ASSERT_GT(meta->pieces_size(), 0);
  const v1::BufferPiece& piece = meta->pieces(0);
  for (uint64_t i = 0; i < piece.size(); ++i) base[piece.offset() + i] = 0x5a;
  auto read = client->ReadPages("p", *pages);
  ASSERT_OK(read);
  EXPECT_EQ(std::string(piece.size(), '\x5a'), read->substr(0, piece.size()));
  munmap(base, pool->total_bytes());
}

TEST(ImportsTest, OnlySealedMemfdsArePassed) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.started()) << daemon.log();
  auto client = std::move(Client::Connect(daemon.target(), "engine").value());
  ASSERT_OK(client->CreatePool(Spec("p")));
  ScopedFd unsealed(memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(0, ftruncate(unsealed.get(), 1 << 20));
  auto refused = client->PassDescriptor(unsealed.get());
  EXPECT_ERROR(InvalidArgument, refused);
  EXPECT_NE(std::string::npos, refused.status().message().find("F_SEAL_SHRINK"))
      << refused.status();
  char path[] = "/tmp/hostkv-imports-XXXXXX";
  ScopedFd file(mkstemp(path));
  unlink(path);
  ASSERT_EQ(0, ftruncate(file.get(), 1 << 20));
  EXPECT_ERROR(InvalidArgument, client->PassDescriptor(file.get()));
  std::vector<v1::DeviceBuffer> k, v;
  Describe(/*handle=*/99, &k, &v);  // never passed
  EXPECT_ERROR(NotFound, client->RegisterDeviceBuffers("p", kSlots, k, v));
  // The daemon still serves.
  EXPECT_OK(client->Alloc("p", kPageSize));
}

TEST(ImportsTest, ImportsPerSessionAreLimited) {
  testing::DaemonProcess daemon(
      {"--max_imports_per_session=2", "--max_import_bytes_per_session=1MiB"});
  ASSERT_TRUE(daemon.started()) << daemon.log();
  auto client = std::move(Client::Connect(daemon.target(), "engine").value());
  ASSERT_OK(client->CreatePool(Spec("p")));
  auto device = ShmDeviceBuffer::CreateSealed(2 * kLayers * kLayerBytes);
  ASSERT_OK(device);
  auto handle = client->PassDescriptor(device->fd());
  ASSERT_OK(handle);
  std::vector<v1::DeviceBuffer> k, v;
  Describe(*handle, &k, &v);
  EXPECT_OK(client->RegisterDeviceBuffers("p", kSlots, k, v));
  EXPECT_OK(client->RegisterDeviceBuffers("p", kSlots, k, v));
  auto third = client->RegisterDeviceBuffers("p", kSlots, k, v);
  EXPECT_ERROR(ResourceExhausted, third);
  EXPECT_NE(std::string::npos,
            third.status().message().find("--max_imports_per_session"));
  // A second descriptor fits (2 per session), a third does not.
  EXPECT_OK(client->PassDescriptor(device->fd()));
  EXPECT_ERROR(ResourceExhausted, client->PassDescriptor(device->fd()));

  auto other = std::move(Client::Connect(daemon.target(), "big").value());
  auto big = ShmDeviceBuffer::CreateSealed(2 << 20);
  ASSERT_OK(big);
  auto big_handle = other->PassDescriptor(big->fd());
  ASSERT_OK(big_handle);
  // 4 buffers x 4096 slots x 64 bytes = 1 MiB: at the cap, accepted; one
  // more slot per buffer is over it.
  std::vector<v1::DeviceBuffer> bk, bv;
  for (uint32_t i = 0; i < 2 * kLayers; ++i) {
    (i % 2 == 0 ? bk : bv)
        .push_back(
            ShmDeviceBuffer::DescribePassed(*big_handle, 0, 4097 * kStride));
  }
  auto over = other->RegisterDeviceBuffers("p", 4097, bk, bv);
  EXPECT_ERROR(ResourceExhausted, over);
  EXPECT_NE(std::string::npos,
            over.status().message().find("--max_import_bytes_per_session"))
      << over.status();
  EXPECT_OK(other->RegisterDeviceBuffers("p", 4096, bk, bv));
}

TEST(ImportsTest, PoolsPerUidAreLimited) {
  testing::DaemonProcess daemon(
      {"--max_pools_per_uid=2", "--max_pool_bytes_per_uid=300KiB"});
  ASSERT_TRUE(daemon.started()) << daemon.log();
  auto client = std::move(Client::Connect(daemon.target(), "engine").value());
  ASSERT_OK(client->CreatePool(Spec("a")));  // 1040 slots x 256 B = 260 KiB
  v1::PoolSpec small = Spec("b");
  small.set_capacity_tokens(64);
  auto too_big = client->CreatePool(Spec("b"));
  EXPECT_ERROR(ResourceExhausted, too_big);
  EXPECT_NE(std::string::npos,
            too_big.status().message().find("--max_pool_bytes_per_uid"))
      << too_big.status();
  ASSERT_OK(client->CreatePool(small));
  v1::PoolSpec third = small;
  third.set_name("c");
  auto refused = client->CreatePool(third);
  EXPECT_ERROR(ResourceExhausted, refused);
  EXPECT_NE(std::string::npos,
            refused.status().message().find("--max_pools_per_uid"))
      << refused.status();
  ASSERT_OK(client->DeletePool("b"));
  EXPECT_OK(client->CreatePool(third));
}

// Each session's signal records (256 x 64 bytes) come out of the memory
// budget, so a session flood cannot take memory the budget does not give.
TEST(ImportsTest, SignalSegmentsCountAgainstTheBudget) {
  testing::DaemonProcess daemon({"--memory_budget=64KiB"});
  ASSERT_TRUE(daemon.started()) << daemon.log();
  std::vector<std::unique_ptr<Client>> clients;
  absl::Status last;
  for (int i = 0; i < 10; ++i) {
    auto client = Client::Connect(daemon.target(), "flood");
    if (!client.ok()) {
      last = client.status();
      break;
    }
    clients.push_back(std::move(*client));
  }
  EXPECT_EQ(4u, clients.size());
  EXPECT_ERROR(ResourceExhausted, last);
  clients.pop_back();
  EXPECT_OK(Client::Connect(daemon.target(), "after"));
}

}  // namespace
}  // namespace hostkv
