// RunGuarded: a SIGBUS inside a guarded call comes back as a fault; one
// outside still kills the process. CpuCopyEngine::CopyLayers: a device
// buffer truncated under the copy fails the copy with DataLoss.
#include "kernels/fault_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_copy_engine.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/sanitizers.h"

namespace hostkv {
namespace {

// A file mapping of `pages` pages whose file is then truncated to 0 bytes:
// every access to it raises SIGBUS.
class TruncatedMapping {
 public:
  explicit TruncatedMapping(size_t pages)
      : bytes_(pages * static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
    fd_ = memfd_create("hostkv-fault-guard-test", 0);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(0, ftruncate(fd_, static_cast<off_t>(bytes_)));
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(MAP_FAILED, p);
    data_ = static_cast<uint8_t*>(p);
    EXPECT_EQ(0, ftruncate(fd_, 0));
  }
  ~TruncatedMapping() {
    munmap(data_, bytes_);
    close(fd_);
  }
  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  const size_t bytes_;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
};

struct ReadArgs {
  const volatile uint8_t* at;
  uint8_t value;
};

void ReadByte(void* arg) {
  auto* a = static_cast<ReadArgs*>(arg);
  a->value = *a->at;
}

TEST(FaultGuardTest, GuardedReadOfTruncatedMappingReturnsTheFault) {
  if (::hostkv::testing::kThreadSanitizer) GTEST_SKIP() << ::hostkv::testing::kNoFaultGuardUnderTsan;
  TruncatedMapping mapping(2);
  ReadArgs args{mapping.data() + 100, 0};
  const GuardedFault fault = RunGuarded(&ReadByte, &args);
  EXPECT_TRUE(fault.faulted);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mapping.data() + 100), fault.address);
  // The guard is reusable on the same thread, and faults do not leak into
  // calls that do not fault.
  uint8_t ok = 42;
  ReadArgs fine{&ok, 0};
  EXPECT_FALSE(RunGuarded(&ReadByte, &fine).faulted);
  EXPECT_EQ(42, fine.value);
  ReadArgs again{mapping.data() + mapping.bytes() - 1, 0};
  EXPECT_TRUE(RunGuarded(&ReadByte, &again).faulted);
}

TEST(FaultGuardTest, GuardsEachThreadOnItsOwn) {
  if (::hostkv::testing::kThreadSanitizer) GTEST_SKIP() << ::hostkv::testing::kNoFaultGuardUnderTsan;
  TruncatedMapping mapping(1);
  std::atomic<int> faults{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        ReadArgs args{mapping.data() + i, 0};
        if (RunGuarded(&ReadByte, &args).faulted) faults.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(200, faults.load());
}

// The guard leaves a SIGBUS outside a guarded call alone: the process dies
// of it, as it would without the handler.
TEST(FaultGuardDeathTest, UnguardedFaultStillKills) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "under a sanitizer its own SIGBUS handler reports the fault "
                  "(as it should) instead of the default action";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "under a sanitizer its own SIGBUS handler reports the fault "
                  "(as it should) instead of the default action";
#endif
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  InstallFaultHandler();
  EXPECT_EXIT(
      {
        TruncatedMapping mapping(1);
        volatile uint8_t v =
            *reinterpret_cast<volatile uint8_t*>(mapping.data());
        (void)v;
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

TEST(FaultGuardTest, CopyLayersFailsWithDataLossWhenTheDeviceBufferVanishes) {
  if (::hostkv::testing::kThreadSanitizer) GTEST_SKIP() << ::hostkv::testing::kNoFaultGuardUnderTsan;
  PoolGeometry g;
  g.attention = Attention::kMla;
  g.layout = HostLayout::kLayerFirst;
  g.num_layers = 4;
  g.num_heads = 1;
  g.head_bytes = 1024;
  g.page_size = 16;
  g.token_slots = 256;
  std::vector<uint8_t> host(g.total_bytes(), 7);
  const uint64_t layer_bytes = g.token_slots * g.token_stride();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  TruncatedMapping device((g.num_layers * layer_bytes + page - 1) / page);
  std::vector<LayerBuffers> layers;
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    layers.push_back({{device.data() + l * layer_bytes, nullptr}});
  }
  CopyTask task;
  task.geometry = g;
  task.host_base = host.data();
  task.layers = layers.data();
  task.runs = {{0, 0, g.token_slots}};
  task.IndexRuns();
  task.direction = CopyDirection::kHostToDevice;
  for (size_t threads : {1u, 3u}) {
    WorkerPool workers(threads);
    CpuCopyEngine engine(&workers);
    std::atomic<int> reported{0};
    const absl::Status s = engine.CopyLayers(
        task, 0, g.num_layers, [] { return true; },
        [&](uint32_t) { reported.fetch_add(1); });
    EXPECT_ERROR(DataLoss, s);
    EXPECT_NE(std::string::npos, s.message().find("SIGBUS")) << s;
    EXPECT_EQ(0, reported.load());
  }
}

}  // namespace
}  // namespace hostkv
