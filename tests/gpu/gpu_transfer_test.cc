// hostkvd's CUDA data path end to end, as an inference engine uses it: this
// test process is the engine (KV buffers from cudaMalloc exported with
// ExportCudaBuffer, GPU signal words from GpuSignals, its own CUDA streams)
// and a real hostkvd --cuda=on is the daemon, so every buffer crosses a
// process boundary through CUDA IPC. Expected bytes come from the
// independent layout model (tests/kernels/reference_layout.h).
//
// Without a GPU every test skips; tests/gpu/run.sh runs them on one.
#include <cuda_runtime_api.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "hostkv/client.h"
#include "hostkv/cuda_buffers.h"
#include "proto/contract/shm_segment.h"
#include "tests/gpu/gpu_engine.h"
#include "tests/gpu/gpu_test_fixture.h"
#include "tests/gpu/kv_images.h"
#include "tests/gpu/self_exec.h"
#include "tests/gpu/spin_kernel.h"
#include "tests/testing/pool_segment.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

using gpu_testing::BufferPatterns;
using gpu_testing::CudaStream;
using gpu_testing::DeviceMemory;
using gpu_testing::EndEngines;
using gpu_testing::Engine;
using gpu_testing::EngineKvCache;
using gpu_testing::kSmallMha;
using gpu_testing::kSmallMla;
using gpu_testing::kWaitTimeout;
using gpu_testing::Model;
using gpu_testing::Spec;
using gpu_testing::SuiteDaemon;

constexpr uint8_t kBackground = 0xC3;  // cleared device memory

// ---------------------------------------------------------------------------
// Every layout x mechanism x page size x MHA/MLA: backup from scattered
// device rows into scattered host pages, then load into other rows.

using RoundTripParam =
    std::tuple<bool /*mla*/, v1::Layout, uint32_t /*page*/, v1::CopyMechanism>;

std::string RoundTripName(const RoundTripParam& p) {
  const auto& [mla, layout, ps, mechanism] = p;
  return absl::StrCat(mla ? "Mla" : "Mha", "_",
                      v1::Layout_Name(layout).substr(7), "_ps", ps, "_",
                      v1::CopyMechanism_Name(mechanism).substr(10));
}

class GpuRoundTripTest : public ::testing::TestWithParam<RoundTripParam> {
 protected:
  static void SetUpTestSuite() { SuiteDaemon::Start(); }
  static void TearDownTestSuite() { SuiteDaemon::Stop(); }
};

TEST_P(GpuRoundTripTest, BackupThenLoadPutsEveryByteInItsPlace) {
  HOSTKV_SKIP_WITHOUT_GPU();
  ASSERT_DAEMON();
  const auto& [mla, layout, ps, mechanism] = GetParam();
  const std::string name = "rt-" + RoundTripName(GetParam());
  const Model& model = mla ? kSmallMla : kSmallMha;
  const uint64_t tokens = 6 * ps;
  // Layer 0 in allocations of its own; layers 1 and 2 in one allocation,
  // every second buffer 2 bytes off 16-byte alignment.
  auto engine = Engine::Start(Spec(name, model, layout, ps, 32 * ps),
                              2 * tokens + 32, /*shared_from=*/1,
                              /*misalign=*/2);
  ASSERT_OK(engine);
  Engine& e = **engine;
  auto pages = gpu_testing::ScatteredPages(e.client(), name, ps);
  ASSERT_OK(pages);
  ASSERT_EQ(4u, pages->size());  // {1}, {3}, {5}, {8..10}
  const std::vector<SlotRange> from = {{tokens + 7, tokens / 2},
                                       {3, tokens - tokens / 2}};
  const std::vector<SlotRange> to = {{1, tokens / 3},
                                     {tokens + 20, tokens - tokens / 3}};
  const BufferPatterns patterns = gpu_testing::MakePatterns(e.cache(), 1);
  ASSERT_OK(e.cache().Fill(kBackground));
  ASSERT_OK(gpu_testing::WritePatterns(e.cache(), patterns));
  auto segment = testing::MapPoolSegment(e.client(), name);
  ASSERT_OK(segment);
  const reference::ReferencePool reference(
      gpu_testing::ReferenceSpec(e.pool()));
  ASSERT_EQ(reference.TotalBytes(), e.pool().total_bytes());
  ASSERT_LE(reference.TotalBytes(), segment->size());
  std::vector<uint8_t> pool_image(segment->data(),
                                  segment->data() + reference.TotalBytes());

  TransferOptions options;
  options.mechanism = mechanism;
  auto backup = e.client().Backup(name, e.import_id(), *pages, from, options);
  ASSERT_OK(backup);
  EXPECT_EQ(model.layers, backup->num_layers);
  EXPECT_EQ(tokens, backup->num_tokens);
  EXPECT_EQ(tokens * e.cache().shape().planes * model.layers *
                e.pool().token_stride(),
            backup->bytes);
  EXPECT_NE(0u, backup->signal_value);
  ASSERT_OK(gpu_testing::AwaitOperation(e.client(), *backup));
  gpu_testing::OverlayBackup(reference, patterns, *pages, from, tokens,
                             &pool_image);
  EXPECT_TRUE(gpu_testing::PoolMatches(reference, pool_image, segment->data()));

  ASSERT_OK(e.cache().Fill(kBackground));
  auto load = e.client().Load(name, e.import_id(), *pages, to, options);
  ASSERT_OK(load);
  EXPECT_GT(load->signal_value, backup->signal_value);
  ASSERT_OK(gpu_testing::AwaitOperation(e.client(), *load));
  EXPECT_TRUE(gpu_testing::CacheMatches(
      e.cache(), gpu_testing::ExpectedCache(e.cache(), patterns, from, to,
                                            tokens, kBackground)));
  EXPECT_TRUE(gpu_testing::PoolMatches(reference, pool_image, segment->data()))
      << "a load must leave the pool as it was";
  for (uint32_t l = 0; l < model.layers; ++l) {
    auto word = e.signals().ReadWord(l);
    ASSERT_OK(word);
    EXPECT_EQ(load->signal_value, *word) << "signal word of layer " << l;
  }
  EndEngines(name, {&*engine});
}

INSTANTIATE_TEST_SUITE_P(
    Mha, GpuRoundTripTest,
    ::testing::Combine(
        ::testing::Values(false),
        ::testing::Values(v1::LAYOUT_LAYER_FIRST, v1::LAYOUT_PAGE_FIRST,
                          v1::LAYOUT_PAGE_FIRST_DIRECT, v1::LAYOUT_PAGE_HEAD),
        ::testing::Values(1u, 16u, 64u),
        ::testing::Values(v1::MECHANISM_KERNEL, v1::MECHANISM_DIRECT)),
    [](const auto& info) { return RoundTripName(info.param); });
INSTANTIATE_TEST_SUITE_P(
    Mla, GpuRoundTripTest,
    ::testing::Combine(
        ::testing::Values(true),
        ::testing::Values(v1::LAYOUT_LAYER_FIRST, v1::LAYOUT_PAGE_FIRST,
                          v1::LAYOUT_PAGE_FIRST_DIRECT),
        ::testing::Values(1u, 16u, 64u),
        ::testing::Values(v1::MECHANISM_KERNEL, v1::MECHANISM_DIRECT)),
    [](const auto& info) { return RoundTripName(info.param); });

// ---------------------------------------------------------------------------
// Ordering on the GPU: per-layer signals on the engine's stream, and backups
// that wait for the engine's "KV written" mark.

std::string MechanismName(
    const ::testing::TestParamInfo<v1::CopyMechanism>& info) {
  return v1::CopyMechanism_Name(info.param).substr(10);
}

class GpuOrderingTest : public ::testing::TestWithParam<v1::CopyMechanism> {
 protected:
  static void SetUpTestSuite() { SuiteDaemon::Start(); }
  static void TearDownTestSuite() { SuiteDaemon::Stop(); }
};

// A 256 MiB load of 32 layers; the engine stream waits for each layer, then
// copies that layer's buffers away. Every copy must see its layer loaded.
TEST_P(GpuOrderingTest, EngineStreamSeesEachLayerLoadedAfterItsWait) {
  HOSTKV_SKIP_WITHOUT_GPU();
  ASSERT_DAEMON();
  constexpr uint32_t kPs = 64;
  constexpr uint64_t kTokens = 4096;
  constexpr Model kModel{false, 32, 4, 128};  // 1 KiB rows
  const std::string name = "order-" + MechanismName({GetParam(), 0});
  auto engine =
      Engine::Start(Spec(name, kModel, v1::LAYOUT_PAGE_FIRST, kPs, kTokens),
                    kTokens + 2 * kPs);
  ASSERT_OK(engine);
  Engine& e = **engine;
  const EngineKvCache& cache = e.cache();
  const uint64_t bytes = cache.buffer_bytes();
  const uint64_t stride = cache.shape().token_stride;
  const uint32_t planes = cache.shape().planes;
  auto pages = e.client().Alloc(name, kTokens);
  ASSERT_OK(pages);
  const BufferPatterns patterns = gpu_testing::MakePatterns(cache, 2);
  ASSERT_OK(gpu_testing::WritePatterns(cache, patterns));
  TransferOptions options;
  options.mechanism = GetParam();
  auto backup =
      e.client().Backup(name, e.import_id(), *pages, {{0, kTokens}}, options);
  ASSERT_OK(backup);
  ASSERT_OK(gpu_testing::AwaitOperation(e.client(), *backup));
  ASSERT_OK(cache.Fill(kBackground));

  auto check = DeviceMemory::Allocate(kModel.layers * planes * bytes);
  ASSERT_OK(check);
  auto early = DeviceMemory::Allocate(bytes);
  ASSERT_OK(early);
  auto stream = CudaStream::Create();
  ASSERT_OK(stream);
  auto side = CudaStream::Create();
  ASSERT_OK(side);
  auto load =
      e.client().Load(name, e.import_id(), *pages, {{kPs, kTokens}}, options);
  ASSERT_OK(load);
  // A control without a wait: how much of the last layer is there already.
  const uint32_t last = kModel.layers - 1;
  ASSERT_EQ(cudaSuccess,
            cudaMemcpyAsync(early->data(), cache.buffer(0, last), bytes,
                            cudaMemcpyDeviceToDevice, side->get()));
  for (uint32_t l = 0; l < kModel.layers; ++l) {
    ASSERT_OK(e.signals().WaitLayer(*load, l, stream->get()));
    for (uint32_t kv = 0; kv < planes; ++kv) {
      ASSERT_EQ(cudaSuccess,
                cudaMemcpyAsync(check->data() + (l * planes + kv) * bytes,
                                cache.buffer(kv, l), bytes,
                                cudaMemcpyDeviceToDevice, stream->get()));
    }
  }
  const absl::Status synced =
      gpu_testing::AwaitStream(stream->get(), kWaitTimeout);
  if (absl::IsDeadlineExceeded(synced))
    gpu_testing::AbortStuckStream(synced, e, *load);
  ASSERT_OK(synced);
  ASSERT_OK(gpu_testing::AwaitStream(side->get(), absl::Seconds(10)));
  ASSERT_OK(gpu_testing::AwaitOperation(e.client(), *load));
  for (uint32_t l = 0; l < kModel.layers; ++l) {
    auto word = e.signals().ReadWord(l);
    ASSERT_OK(word);
    EXPECT_EQ(load->signal_value, *word) << "signal word of layer " << l;
  }

  std::vector<uint8_t> seen(check->size());
  ASSERT_EQ(cudaSuccess, cudaMemcpy(seen.data(), check->data(), seen.size(),
                                    cudaMemcpyDeviceToHost));
  std::vector<uint8_t> expected(bytes);
  std::string wrong_layers;
  for (uint32_t l = 0; l < kModel.layers; ++l) {
    for (uint32_t kv = 0; kv < planes; ++kv) {
      std::fill(expected.begin(), expected.end(), kBackground);
      std::memcpy(expected.data() + kPs * stride,
                  patterns[l * planes + kv].data(), kTokens * stride);
      const ::testing::AssertionResult same = gpu_testing::RowsMatch(
          absl::StrCat(kv == 0 ? "K" : "V", " layer ", l,
                       " as the engine stream saw it after WaitLayer"),
          expected.data(), seen.data() + (l * planes + kv) * bytes, bytes,
          stride);
      if (!same && wrong_layers.empty()) ADD_FAILURE() << same.message();
      if (!same) absl::StrAppend(&wrong_layers, " ", l, kv == 0 ? "K" : "V");
    }
  }
  EXPECT_EQ("", wrong_layers) << "buffers seen before their layer was loaded";

  // Informational: rows of the last layer already loaded when a copy that
  // did not wait ran (fewer than all shows the waits were needed).
  std::vector<uint8_t> control(bytes);
  ASSERT_EQ(cudaSuccess, cudaMemcpy(control.data(), early->data(), bytes,
                                    cudaMemcpyDeviceToHost));
  uint64_t loaded_rows = 0;
  for (uint64_t i = 0; i < kTokens; ++i) {
    loaded_rows +=
        std::memcmp(control.data() + (kPs + i) * stride,
                    patterns[last * planes].data() + i * stride, stride) == 0;
  }
  RecordProperty("control_rows_loaded_without_wait",
                 absl::StrCat(loaded_rows, "/", kTokens));
  std::printf(
      "[   INFO   ] a copy of layer %u that did not wait saw %llu of "
      "%llu rows loaded\n",
      last, static_cast<unsigned long long>(loaded_rows),
      static_cast<unsigned long long>(kTokens));
  EndEngines(name, {&*engine});
}

// The engine queues a ~200 ms kernel, then writes new KV, then marks "KV
// written"; a backup submitted meanwhile with wait_kv_written must copy the
// new KV, and one submitted without it (the control) the old.
TEST_P(GpuOrderingTest, BackupWaitingForKvWrittenCopiesTheNewKv) {
  HOSTKV_SKIP_WITHOUT_GPU();
  ASSERT_DAEMON();
  constexpr uint32_t kPs = 16;
  constexpr uint64_t kTokens = 256;
  constexpr Model kModel{false, 4, 4, 128};
  const std::string name = "kvw-" + MechanismName({GetParam(), 0});
  auto engine = Engine::Start(
      Spec(name, kModel, v1::LAYOUT_LAYER_FIRST, kPs, 4 * kTokens),
      kTokens + kPs);
  ASSERT_OK(engine);
  Engine& e = **engine;
  const EngineKvCache& cache = e.cache();
  const uint64_t bytes = cache.buffer_bytes();
  const uint32_t planes = cache.shape().planes;
  const BufferPatterns old_kv = gpu_testing::MakePatterns(cache, 3);
  const BufferPatterns new_kv = gpu_testing::MakePatterns(cache, 4);
  ASSERT_OK(gpu_testing::WritePatterns(cache, old_kv));
  auto fresh = DeviceMemory::Allocate(kModel.layers * planes * bytes);
  ASSERT_OK(fresh);
  for (size_t b = 0; b < new_kv.size(); ++b) {
    ASSERT_EQ(cudaSuccess,
              cudaMemcpy(fresh->data() + b * bytes, new_kv[b].data(), bytes,
                         cudaMemcpyHostToDevice));
  }
  ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
  auto control_pages = e.client().Alloc(name, kTokens);
  ASSERT_OK(control_pages);
  auto waited_pages = e.client().Alloc(name, kTokens);
  ASSERT_OK(waited_pages);
  auto segment = testing::MapPoolSegment(e.client(), name);
  ASSERT_OK(segment);
  const reference::ReferencePool reference(
      gpu_testing::ReferenceSpec(e.pool()));
  std::vector<uint8_t> pool_image(segment->data(),
                                  segment->data() + reference.TotalBytes());

  auto stream = CudaStream::Create();
  ASSERT_OK(stream);
  int device = 0;
  ASSERT_EQ(cudaSuccess, cudaGetDevice(&device));
  ASSERT_EQ(cudaSuccess,
            gpu_testing::LaunchSpinKernel(200, device, stream->get()));
  for (uint32_t l = 0; l < kModel.layers; ++l) {
    for (uint32_t kv = 0; kv < planes; ++kv) {
      ASSERT_EQ(
          cudaSuccess,
          cudaMemcpyAsync(cache.buffer(kv, l),
                          fresh->data() + (l * planes + kv) * bytes, bytes,
                          cudaMemcpyDeviceToDevice, stream->get()));
    }
  }
  auto written = e.signals().MarkKvWritten(stream->get());
  ASSERT_OK(written);
  TransferOptions options;
  options.mechanism = GetParam();
  auto control = e.client().Backup(name, e.import_id(), *control_pages,
                                   {{0, kTokens}}, options);
  ASSERT_OK(control);
  options.wait_kv_written = *written;
  auto waited = e.client().Backup(name, e.import_id(), *waited_pages,
                                  {{0, kTokens}}, options);
  ASSERT_OK(waited);
  EXPECT_EQ(cudaErrorNotReady, cudaStreamQuery(stream->get()))
      << "the spin kernel ended before the backups were submitted, so this "
         "test shows nothing; make it spin longer";
  ASSERT_OK(gpu_testing::AwaitOperation(e.client(), *control));
  ASSERT_OK(gpu_testing::AwaitOperation(e.client(), *waited));
  ASSERT_OK(gpu_testing::AwaitStream(stream->get(), kWaitTimeout));
  auto word = e.signals().ReadWord(kModel.layers);
  ASSERT_OK(word);
  EXPECT_EQ(*written, *word);

  gpu_testing::OverlayBackup(reference, old_kv, *control_pages, {{0, kTokens}},
                             kTokens, &pool_image);
  gpu_testing::OverlayBackup(reference, new_kv, *waited_pages, {{0, kTokens}},
                             kTokens, &pool_image);
  EXPECT_TRUE(gpu_testing::PoolMatches(reference, pool_image, segment->data()))
      << "pages " << control_pages->front().first_page
      << "... hold the control (old KV), pages "
      << waited_pages->front().first_page << "... the waited backup (new KV)";
  EndEngines(name, {&*engine});
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, GpuOrderingTest,
                         ::testing::Values(v1::MECHANISM_KERNEL,
                                           v1::MECHANISM_DIRECT),
                         MechanismName);

// ---------------------------------------------------------------------------
// Registration errors over the wire, a session that ends with a backup
// blocked on "KV written", and the daemon still serving afterwards.

class GpuSessionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { SuiteDaemon::Start(); }
  static void TearDownTestSuite() { SuiteDaemon::Stop(); }

  // A small round trip through `e`'s import: backup, clear, load, compare.
  static void ExpectRoundTrip(Engine& e) {
    const uint32_t ps = e.pool().spec().page_size();
    const uint64_t tokens = 2 * ps;
    ASSERT_GE(e.cache().shape().token_slots, 2 * tokens + 3);
    auto pages = e.client().Alloc(e.name(), tokens);
    ASSERT_OK(pages);
    const BufferPatterns patterns = gpu_testing::MakePatterns(e.cache(), 5);
    ASSERT_OK(e.cache().Fill(kBackground));
    ASSERT_OK(gpu_testing::WritePatterns(e.cache(), patterns));
    const std::vector<SlotRange> from = {{2, tokens}};
    const std::vector<SlotRange> to = {{tokens + 3, tokens}};
    auto backup = e.client().Backup(e.name(), e.import_id(), *pages, from);
    ASSERT_OK(backup);
    ASSERT_OK(gpu_testing::AwaitOperation(e.client(), *backup));
    ASSERT_OK(e.cache().Fill(kBackground));
    auto load = e.client().Load(e.name(), e.import_id(), *pages, to);
    ASSERT_OK(load);
    ASSERT_OK(gpu_testing::AwaitOperation(e.client(), *load));
    EXPECT_TRUE(gpu_testing::CacheMatches(
        e.cache(), gpu_testing::ExpectedCache(e.cache(), patterns, from, to,
                                              tokens, kBackground)));
    ASSERT_OK(e.client().Free(e.name(), *pages));
  }
};

TEST_F(GpuSessionTest, BadRegistrationsGetPreciseErrors) {
  HOSTKV_SKIP_WITHOUT_GPU();
  ASSERT_DAEMON();
  constexpr uint32_t kPs = 16;
  constexpr uint64_t kSlots = 10 * kPs;
  auto engine = Engine::Start(
      Spec("errors", {false, 2, 2, 64}, v1::LAYOUT_PAGE_FIRST, kPs, 8 * kPs),
      kSlots);
  ASSERT_OK(engine);
  Engine& e = **engine;
  Client& client = e.client();
  const std::vector<v1::DeviceBuffer>& k = e.cache().k();
  const std::vector<v1::DeviceBuffer>& v = e.cache().v();

  std::vector<v1::DeviceBuffer> bad = k;
  std::string garbage(64, '\0');
  for (size_t i = 0; i < garbage.size(); ++i)
    garbage[i] = static_cast<char>(i * 37 + 11);
  bad[1].set_cuda_ipc_handle(garbage);
  EXPECT_ERROR(FailedPrecondition,
               client.RegisterDeviceBuffers("errors", kSlots, bad, v));
  bad = k;
  bad[0].set_offset(bad[0].offset() + (uint64_t{1} << 40));
  EXPECT_ERROR(InvalidArgument,
               client.RegisterDeviceBuffers("errors", kSlots, bad, v));
  bad[0].set_offset(UINT64_MAX - 8);  // offset + size wraps around
  EXPECT_ERROR(InvalidArgument,
               client.RegisterDeviceBuffers("errors", kSlots, bad, v));
  // Starts inside a 4 MiB allocation, ends 36 KiB past it.
  auto tail = DeviceMemory::Allocate(4 << 20);
  ASSERT_OK(tail);
  auto straddling = ExportCudaBuffer(tail->data(), k[0].size());
  ASSERT_OK(straddling);
  bad = k;
  bad[0] = *straddling;
  bad[0].set_offset((4 << 20) - 4096);
  EXPECT_ERROR(InvalidArgument,
               client.RegisterDeviceBuffers("errors", kSlots, bad, v));
  bad = k;
  bad[0].set_device_uuid(std::string(16, '\xEE'));
  EXPECT_ERROR(NotFound,
               client.RegisterDeviceBuffers("errors", kSlots, bad, v));
  bad = k;
  bad[0].clear_device_uuid();
  bad[0].set_device(99);
  EXPECT_ERROR(NotFound,
               client.RegisterDeviceBuffers("errors", kSlots, bad, v));

  auto pages = client.Alloc("errors", kPs);
  ASSERT_OK(pages);
  TransferOptions waits;
  waits.wait_kv_written = 1;
  EXPECT_ERROR(InvalidArgument,
               client.Load("errors", e.import_id(), *pages, {{0, kPs}}, waits));
  // The same buffers again, without GPU signals: their mappings are shared.
  auto plain = client.RegisterDeviceBuffers("errors", kSlots, k, v);
  ASSERT_OK(plain);
  // But the signal words of a live import are its own.
  EXPECT_ERROR(FailedPrecondition,
               client.RegisterDeviceBuffers("errors", kSlots, k, v,
                                            &e.signals().buffer()));
  EXPECT_ERROR(InvalidArgument,
               client.Backup("errors", *plain, *pages, {{0, kPs}}, waits));
  auto no_signal = client.Backup("errors", *plain, *pages, {{0, kPs}});
  ASSERT_OK(no_signal);
  EXPECT_EQ(0u, no_signal->signal_value);
  ASSERT_OK(gpu_testing::AwaitOperation(client, *no_signal));
  ASSERT_OK(client.Free("errors", *pages));

  // After all of that the daemon still serves.
  auto serving = CheckHealth(SuiteDaemon::get()->target());
  ASSERT_OK(serving);
  EXPECT_TRUE(*serving);
  ExpectRoundTrip(e);
  EndEngines("errors", {&*engine});
}

// An engine closes its session while its backup waits for a "KV written"
// mark that never comes: the close must return, and the daemon go on.
TEST_F(GpuSessionTest, ClosingWithABackupBlockedOnKvWrittenReturns) {
  HOSTKV_SKIP_WITHOUT_GPU();
  ASSERT_DAEMON();
  constexpr uint32_t kPs = 16;
  const v1::PoolSpec spec = Spec("session-end", {false, 4, 2, 64},
                                 v1::LAYOUT_PAGE_FIRST_DIRECT, kPs, 16 * kPs);
  auto blocked = Engine::Start(spec, 8 * kPs);
  ASSERT_OK(blocked);
  Engine& a = **blocked;
  for (v1::CopyMechanism mechanism :
       {v1::MECHANISM_KERNEL, v1::MECHANISM_DIRECT}) {
    auto pages = a.client().Alloc("session-end", 2 * kPs);
    ASSERT_OK(pages);
    TransferOptions options;
    options.mechanism = mechanism;
    options.wait_kv_written = 1000;  // never marked
    ASSERT_OK(a.client().Backup("session-end", a.import_id(), *pages,
                                {{kPs, 2 * kPs}}, options));
  }
  std::promise<absl::Status> closed;
  std::future<absl::Status> result = closed.get_future();
  std::thread closer([&] { closed.set_value(a.client().Close()); });
  if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    const absl::StatusOr<uint64_t> word = a.signals().ReadWord(a.layers());
    ADD_FAILURE() << "Close() did not return within 20 s: the backups still "
                     "wait for \"KV written\" >= 1000, a word that now holds "
                  << (word.ok() ? std::to_string(*word)
                                : word.status().ToString());
    SuiteDaemon::GiveUp("CloseSession does not return");
    closer.join();  // the call fails once the daemon is gone
    return;
  }
  closer.join();
  EXPECT_OK(result.get());

  auto serving = CheckHealth(SuiteDaemon::get()->target());
  ASSERT_OK(serving);
  EXPECT_TRUE(*serving);
  // A second engine on the same pool: the first one's pages are free, and
  // a round trip works.
  auto second = Engine::Start(spec, 8 * kPs);
  ASSERT_OK(second);
  auto stats = (*second)->client().GetPoolStats("session-end");
  ASSERT_OK(stats);
  ASSERT_EQ(1, stats->pools_size());
  EXPECT_EQ(0u, stats->pools(0).used_pages());
  ExpectRoundTrip(**second);
  EndEngines("session-end", {&*second, &*blocked});
}

// Several sessions, each with its own import (so its own stream), copying
// on one GPU at once: every engine gets its own bytes back.
TEST_F(GpuSessionTest, ManyEnginesAtOnceEachGetTheirOwnBytes) {
  HOSTKV_SKIP_WITHOUT_GPU();
  ASSERT_DAEMON();
  constexpr uint32_t kPs = 16;
  constexpr int kEngines = 6;
  const v1::PoolSpec spec = Spec("many", {false, 3, 2, 64},
                                 v1::LAYOUT_PAGE_FIRST, kPs, 64 * kPs);
  std::vector<std::unique_ptr<Engine>> engines;
  for (int i = 0; i < kEngines; ++i) {
    auto e = Engine::Start(spec, 8 * kPs);
    ASSERT_OK(e);
    engines.push_back(std::move(*e));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kEngines; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 3; ++round) ExpectRoundTrip(*engines[i]);
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::unique_ptr<Engine>*> all;
  for (auto& e : engines) all.push_back(&e);
  EndEngines("many", all);
}

// An engine process killed mid-copy. The child is this test binary run
// again (fork + exec: a forked child may not use the CUDA state of a parent
// that initialized CUDA) with only GpuChildEngine.* and the daemon's target
// in the environment; it registers a large KV cache, starts a large backup
// and one that waits for a mark it never makes, says so on a pipe and
// waits to be SIGKILLed. The daemon must end its session (the session
// socket closes), release the blocked wait, drop its import and keep
// serving: the parent's own round trip stays byte-exact.
constexpr char kChildTargetEnv[] = "HOSTKV_GPU_CHILD_TARGET";
constexpr char kChildReadyFdEnv[] = "HOSTKV_GPU_CHILD_READY_FD";
constexpr uint32_t kKilledPs = 16;
constexpr uint64_t kKilledTokens = 16384;  // 8 layers x 4 KiB: 512 MiB

v1::PoolSpec KilledChildSpec() {
  return Spec("killed-child", {false, 8, 8, 128}, v1::LAYOUT_PAGE_FIRST,
              kKilledPs, kKilledTokens + kKilledPs);
}

// Runs only as the child of KilledEngineLeavesTheDaemonServing (DISABLED_:
// not part of a normal run, where a skip would count as a failure).
TEST(GpuChildEngine, DISABLED_StartsLargeBackupsAndWaitsToBeKilled) {
  const char* target = std::getenv(kChildTargetEnv);
  const char* ready_fd = std::getenv(kChildReadyFdEnv);
  ASSERT_TRUE(target != nullptr && ready_fd != nullptr)
      << "the child engine of KilledEngineLeavesTheDaemonServing";
  auto e = Engine::StartOn(target, KilledChildSpec(), kKilledTokens + 3);
  ASSERT_OK(e);
  ASSERT_OK(gpu_testing::WritePatterns(
      (*e)->cache(), gpu_testing::MakePatterns((*e)->cache(), 9)));
  auto pages = (*e)->client().Alloc("killed-child", kKilledTokens);
  ASSERT_OK(pages);
  ASSERT_OK((*e)->client().Backup("killed-child", (*e)->import_id(), *pages,
                                  {{0, kKilledTokens}}));
  auto blocked = (*e)->client().Alloc("killed-child", kKilledPs);
  if (blocked.ok()) {
    TransferOptions options;
    options.wait_kv_written = 1000;  // never marked
    ASSERT_OK((*e)->client().Backup("killed-child", (*e)->import_id(),
                                    *blocked, {{0, kKilledPs}}, options));
  }
  const char byte = 1;
  ASSERT_EQ(1, write(std::atoi(ready_fd), &byte, 1));
  for (;;) pause();  // SIGKILL ends it
}

TEST_F(GpuSessionTest, KilledEngineLeavesTheDaemonServing) {
  HOSTKV_SKIP_WITHOUT_GPU();
  ASSERT_DAEMON();
  constexpr uint32_t kPs = 16;
  const v1::PoolSpec spec = Spec("killed-parent", {false, 4, 2, 64},
                                 v1::LAYOUT_PAGE_FIRST, kPs, 16 * kPs);
  auto parent = Engine::Start(spec, 8 * kPs);
  ASSERT_OK(parent);
  ExpectRoundTrip(**parent);

  int ready[2];
  ASSERT_EQ(0, pipe(ready));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    setenv(kChildTargetEnv, SuiteDaemon::get()->target().c_str(), 1);
    setenv(kChildReadyFdEnv, std::to_string(ready[1]).c_str(), 1);
    gpu_testing::ExecSelf({"--gtest_also_run_disabled_tests",
                           "--gtest_filter=GpuChildEngine.*"});
    _exit(127);
  }
  close(ready[1]);
  pollfd p{ready[0], POLLIN, 0};
  char byte = 0;
  const bool started = poll(&p, 1, 120000) == 1 && read(ready[0], &byte, 1) == 1;
  close(ready[0]);
  kill(child, SIGKILL);
  int wstatus = 0;
  ASSERT_EQ(child, waitpid(child, &wstatus, 0));
  ASSERT_TRUE(started) << "the child engine did not start its backups (see "
                          "its output above)";

  // The daemon ends the child's session and drops its import; its pages go.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  bool gone = false;
  while (!gone && absl::Now() < deadline) {
    auto stats = (*parent)->client().GetPoolStats("killed-child");
    ASSERT_OK(stats);
    gone = stats->pools_size() == 1 && stats->pools(0).used_pages() == 0;
    for (const v1::SessionInfo& s : stats->sessions()) {
      if (s.pid() == static_cast<uint32_t>(child)) gone = false;
    }
    if (!gone) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(gone) << "the killed engine's session or pages are still there "
                       "after 30 s";
  auto serving = CheckHealth(SuiteDaemon::get()->target());
  ASSERT_OK(serving);
  EXPECT_TRUE(*serving);
  for (int round = 0; round < 3; ++round) ExpectRoundTrip(**parent);
  EXPECT_OK(gpu_testing::DeletePool("killed-child"));
  EndEngines("killed-parent", {&*parent});
}

// Host-side per-layer waits on a CUDA import, and a load that waits on the
// GPU for the engine's mark: nothing is published before the mark, then
// every layer, and the bytes are those of the backup.
TEST_F(GpuSessionTest, HostWaitLayerSeesALoadThatWaitsForTheMark) {
  HOSTKV_SKIP_WITHOUT_GPU();
  ASSERT_DAEMON();
  constexpr uint32_t kPs = 16;
  const v1::PoolSpec spec = Spec("host-layers", {false, 4, 2, 64},
                                 v1::LAYOUT_PAGE_FIRST, kPs, 16 * kPs);
  auto engine = Engine::Start(spec, 8 * kPs);
  ASSERT_OK(engine);
  Engine& e = **engine;
  const uint64_t tokens = 2 * kPs;
  auto pages = e.client().Alloc("host-layers", tokens);
  ASSERT_OK(pages);
  const BufferPatterns patterns = gpu_testing::MakePatterns(e.cache(), 9);
  ASSERT_OK(e.cache().Fill(kBackground));
  ASSERT_OK(gpu_testing::WritePatterns(e.cache(), patterns));
  const std::vector<SlotRange> from = {{2, tokens}};
  const std::vector<SlotRange> to = {{tokens + 3, tokens}};
  auto backup = e.client().Backup("host-layers", e.import_id(), *pages, from);
  ASSERT_OK(backup);
  ASSERT_OK(gpu_testing::AwaitOperation(e.client(), *backup));
  ASSERT_OK(e.cache().Fill(kBackground));
  TransferOptions options;
  options.mechanism = v1::MECHANISM_DIRECT;
  options.wait_kv_written = 1;  // the first mark, not made yet
  auto load = e.client().Load("host-layers", e.import_id(), *pages, to, options);
  ASSERT_OK(load);
  EXPECT_EQ(absl::StatusCode::kDeadlineExceeded,
            e.client().WaitLayer(*load, 0, absl::Milliseconds(300)).code());
  auto stream = CudaStream::Create();
  ASSERT_OK(stream);
  auto mark = e.signals().MarkKvWritten(stream->get());
  ASSERT_OK(mark);
  ASSERT_EQ(1u, *mark);
  for (uint32_t l = 0; l < e.layers(); ++l) {
    const absl::Status waited = e.client().WaitLayer(*load, l, kWaitTimeout);
    EXPECT_TRUE(waited.ok()) << "layer " << l << ": " << waited;
  }
  ASSERT_OK(gpu_testing::AwaitOperation(e.client(), *load));
  EXPECT_TRUE(gpu_testing::CacheMatches(
      e.cache(), gpu_testing::ExpectedCache(e.cache(), patterns, from, to,
                                            tokens, kBackground)));
  EndEngines("host-layers", {&*engine});
}

// The child re-exec those tests rely on, without a GPU: run.sh --check runs
// SelfExec.* under the bundle's loader, where /proc/self/exe is the loader.
TEST(SelfExec, ArgvGoesThroughTheLoaderWhenOneStartedUs) {
  using gpu_testing::SelfExecArgv;
  const std::vector<std::string> args = {"--gtest_filter=X.*"};
  EXPECT_EQ(SelfExecArgv("/b/bin/t", "/b/bin/t", "", args),
            (std::vector<std::string>{"/b/bin/t", "--gtest_filter=X.*"}));
  EXPECT_EQ(SelfExecArgv("/b/lib/ld-linux-x86-64.so.2", "/b/bin/t", "", args),
            (std::vector<std::string>{"/b/lib/ld-linux-x86-64.so.2",
                                      "--library-path", "/b/lib", "/b/bin/t",
                                      "--gtest_filter=X.*"}));
  EXPECT_EQ(SelfExecArgv("/b/lib/ld-linux-x86-64.so.2", "/b/bin/t",
                         "/b/lib:/usr/lib64", args)[2],
            "/b/lib:/usr/lib64");
}

constexpr char kSelfExecFdEnv[] = "HOSTKV_SELF_EXEC_FD";

TEST(SelfExecChild, DISABLED_SaysItRan) {
  const char* fd = std::getenv(kSelfExecFdEnv);
  ASSERT_NE(fd, nullptr);
  ASSERT_EQ(2, write(std::atoi(fd), "ok", 2));
}

TEST(SelfExec, TheChildRunsThisBinaryAgain) {
  int done[2];
  ASSERT_EQ(0, pipe(done));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(done[0]);
    setenv(kSelfExecFdEnv, std::to_string(done[1]).c_str(), 1);
    gpu_testing::ExecSelf({"--gtest_also_run_disabled_tests",
                           "--gtest_filter=SelfExecChild.*"});
    _exit(127);
  }
  close(done[1]);
  char said[3] = {};
  const ssize_t n = read(done[0], said, 2);
  close(done[0]);
  int wstatus = 0;
  ASSERT_EQ(child, waitpid(child, &wstatus, 0));
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
      << "the re-run child exited with " << wstatus << " (127: exec failed)";
  EXPECT_EQ(2, n);
  EXPECT_STREQ("ok", said);
}

}  // namespace
}  // namespace hostkv
