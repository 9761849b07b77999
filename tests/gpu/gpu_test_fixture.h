// What the tests of gpu_transfer_test.cc share: the hostkvd of the running
// test suite (a real second process, --cuda=on) and the engine side of one
// pool (a session, a KV cache in cudaMalloc'd memory, GPU signal words).
#ifndef HOSTKV_TESTS_GPU_GPU_TEST_FIXTURE_H_
#define HOSTKV_TESTS_GPU_GPU_TEST_FIXTURE_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "hostkv/client.h"
#include "hostkv/cuda_buffers.h"
#include "hostkv/v1/hostkv.pb.h"
#include "tests/gpu/gpu_engine.h"
#include "tests/testing/daemon_process.h"

// The first line of every GPU test: skips without a CUDA device.
#define HOSTKV_SKIP_WITHOUT_GPU()                                  \
  do {                                                             \
    std::string hostkv_why_;                                       \
    if (!::hostkv::gpu_testing::CudaDevicePresent(&hostkv_why_)) { \
      GTEST_SKIP() << "no CUDA device: " << hostkv_why_;           \
    }                                                              \
  } while (0)

// Fails the test when the suite's hostkvd did not start, or was given up
// on by an earlier test of the suite, saying why.
#define ASSERT_DAEMON()                                     \
  ASSERT_TRUE(::hostkv::gpu_testing::SuiteDaemon::usable()) \
      << ::hostkv::gpu_testing::SuiteDaemon::error()

namespace hostkv::gpu_testing {

// The hostkvd of the running test suite (SetUpTestSuite starts it,
// TearDownTestSuite stops it). Each suite starts its own, so that a daemon
// one suite breaks cannot fail the next. Not thread-safe.
class SuiteDaemon {
 public:
  // Starts hostkvd --cuda=on when there is a GPU; get() is null (and
  // error() says why) if it did not start.
  static void Start();
  // With HOSTKV_GPU_TEST_LOGS set, keeps the daemon's log in that folder;
  // prints its end when the suite failed. Then stops it.
  static void Stop();
  static void PrintLogTail();
  // For a daemon that stopped finishing operations: prints its log's end
  // and stops it (SIGTERM, then SIGKILL), so that the suite's later tests
  // fail at once (ASSERT_DAEMON) instead of waiting in turn.
  static void GiveUp(const std::string& why);

  static bool usable() { return daemon_ != nullptr && usable_; }
  static testing::DaemonProcess* get() { return daemon_; }
  static const std::string& error() { return error_; }

 private:
  static inline testing::DaemonProcess* daemon_ = nullptr;
  static inline bool usable_ = false;
  static inline std::string error_ = "hostkvd was not started";
};

// How long an operation of these tests may take (they take milliseconds).
inline constexpr absl::Duration kWaitTimeout = absl::Seconds(20);

// Client::Wait, and SuiteDaemon::GiveUp if the operation does not finish
// within kWaitTimeout.
absl::Status AwaitOperation(Client& client, const Operation& op);

// A model's KV geometry, bf16.
struct Model {
  bool mla;
  uint32_t layers;
  uint32_t heads;  // MHA kv heads
  uint32_t dim;    // MHA head_dim; MLA kv_lora_rank + qk_rope_head_dim
};
// MHA with 400-byte heads in 1,600-byte rows; MLA with DeepSeek's latent
// (512 + 64 elements, 1,152-byte rows).
inline constexpr Model kSmallMha{false, 3, 4, 200};
inline constexpr Model kSmallMla{true, 3, 1, 576};

v1::PoolSpec Spec(const std::string& name, const Model& m, v1::Layout layout,
                  uint32_t page_size, uint64_t capacity_tokens);

// One engine process's side: a session on the suite's daemon, a pinned
// pool, and a KV cache in device memory registered with its GPU signal
// words as one import. Not thread-safe.
class Engine {
 public:
  // Connects, creates the pool, waits until it is pinned, allocates the KV
  // cache (`slots` rows; layers >= shared_from in one allocation, see
  // KvCacheShape) and registers it.
  static absl::StatusOr<std::unique_ptr<Engine>> Start(
      const v1::PoolSpec& spec, uint64_t slots,
      uint32_t shared_from = std::numeric_limits<uint32_t>::max(),
      uint64_t misalign = 0);
  // As Start, on the daemon at `target` (a child engine process has no
  // SuiteDaemon of its own).
  static absl::StatusOr<std::unique_ptr<Engine>> StartOn(
      const std::string& target, const v1::PoolSpec& spec, uint64_t slots,
      uint32_t shared_from = std::numeric_limits<uint32_t>::max(),
      uint64_t misalign = 0);
  // The session ends before the memory it registered is freed.
  ~Engine();

  // Ends the session (the daemon frees its pages and drops its import).
  absl::Status Close() { return client_->Close(); }

  Client& client() { return *client_; }
  const v1::Pool& pool() const { return pool_; }
  const std::string& name() const { return pool_.spec().name(); }
  const EngineKvCache& cache() const { return *cache_; }
  GpuSignals& signals() { return *signals_; }
  uint64_t import_id() const { return import_id_; }
  uint32_t layers() const { return cache_->shape().layers; }

 private:
  Engine() = default;

  std::unique_ptr<EngineKvCache> cache_;
  std::unique_ptr<GpuSignals> signals_;
  std::unique_ptr<Client> client_;
  v1::Pool pool_;
  uint64_t import_id_ = 0;
};

// Deletes a pool once its last session has let go. The daemon drops a CUDA
// import a moment after the operation that held it signalled completion, so
// a pool whose session just closed may still count it for a few ms.
absl::Status DeletePool(const std::string& name);

// Ends the engines' sessions, deletes their pool once the daemon has dropped
// their imports, and only then frees their memory: CUDA leaves freeing
// memory that another process still has open (cudaIpcOpenMemHandle)
// undefined.
void EndEngines(const std::string& pool,
                const std::vector<std::unique_ptr<Engine>*>& engines);

// Host pages with holes: pages 1, 3, 5, then a run of three (in a fresh
// pool).
absl::StatusOr<std::vector<PageRange>> ScatteredPages(Client& client,
                                                      const std::string& pool,
                                                      uint32_t page_size);

// For a stream of this process that waits for a GPU signal that never came:
// nothing can synchronize the device after that (cudaFree would hang), so
// this says what the signal words hold, stops the daemon and exits.
[[noreturn]] void AbortStuckStream(const absl::Status& why, Engine& e,
                                   const Operation& op);

}  // namespace hostkv::gpu_testing

#endif  // HOSTKV_TESTS_GPU_GPU_TEST_FIXTURE_H_
