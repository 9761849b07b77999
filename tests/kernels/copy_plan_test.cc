// ZipRuns, CopyLayerSlice and CpuCopyEngine: loads (host -> device, one
// layer) and backups (device -> host, every layer) checked byte for byte
// against an element-by-element copy through the reference layout model.
#include "kernels/copy_plan.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_copy_engine.h"
#include "kernels/host_order_copy.h"
#include "kernels/pool_geometry.h"
#include "kernels/worker_pool.h"
#include "tests/kernels/reference_layout.h"
#include "tests/kernels/transfer_selections.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

using reference::PatternBuffer;
using reference::PatternByte;
using reference::PoolSpec;
using reference::ReferenceDevice;
using reference::ReferencePool;

using RunTuple = std::tuple<uint64_t, uint64_t, uint64_t>;  // host, dev, n

std::vector<RunTuple> AsTuples(const std::vector<TokenRun>& runs) {
  std::vector<RunTuple> out;
  for (const TokenRun& r : runs) {
    out.emplace_back(r.host_token, r.device_token, r.num_tokens);
  }
  return out;
}

std::vector<uint64_t> Expand(const std::vector<SlotSpan>& spans) {
  std::vector<uint64_t> slots;
  for (const SlotSpan& s : spans) {
    for (uint64_t i = 0; i < s.count; ++i) slots.push_back(s.first + i);
  }
  return slots;
}

// ---------------------------------------------------------------------------
// ZipRuns

TEST(ZipRunsTest, EqualSplitsPairSpanForSpan) {
  EXPECT_EQ((std::vector<RunTuple>{{0, 100, 4}, {8, 200, 4}, {40, 16, 2}}),
            AsTuples(ZipRuns({{0, 4}, {8, 4}, {40, 2}},
                             {{100, 4}, {200, 4}, {16, 2}})));
}

TEST(ZipRunsTest, UnevenSplitsCutAtEveryBoundary) {
  EXPECT_EQ((std::vector<RunTuple>{{0, 10, 2}, {2, 20, 4}}),
            AsTuples(ZipRuns({{0, 6}}, {{10, 2}, {20, 4}})));
  EXPECT_EQ((std::vector<RunTuple>{{0, 50, 3}, {10, 53, 1}, {11, 70, 4}}),
            AsTuples(ZipRuns({{0, 3}, {10, 5}}, {{50, 4}, {70, 4}})));
}

TEST(ZipRunsTest, RunsContiguousOnBothSidesMerge) {
  EXPECT_EQ((std::vector<RunTuple>{{0, 10, 8}}),
            AsTuples(ZipRuns({{0, 4}, {4, 4}}, {{10, 4}, {14, 4}})));
  // Split differently on the two sides, still one run.
  EXPECT_EQ((std::vector<RunTuple>{{0, 10, 8}}),
            AsTuples(ZipRuns({{0, 5}, {5, 3}}, {{10, 3}, {13, 5}})));
}

TEST(ZipRunsTest, RunsContiguousOnOneSideOnlyStayApart) {
  EXPECT_EQ((std::vector<RunTuple>{{0, 10, 4}, {4, 20, 4}}),
            AsTuples(ZipRuns({{0, 4}, {4, 4}}, {{10, 4}, {20, 4}})));
  EXPECT_EQ((std::vector<RunTuple>{{0, 10, 4}, {8, 14, 4}}),
            AsTuples(ZipRuns({{0, 4}, {8, 4}}, {{10, 8}})));
  // Going backwards is not contiguous either.
  EXPECT_EQ((std::vector<RunTuple>{{4, 14, 4}, {0, 10, 4}}),
            AsTuples(ZipRuns({{4, 4}, {0, 4}}, {{14, 4}, {10, 4}})));
}

TEST(ZipRunsTest, ZeroLengthSpansAreSkipped) {
  EXPECT_EQ((std::vector<RunTuple>{{5, 30, 3}, {12, 33, 2}}),
            AsTuples(ZipRuns({{0, 0}, {5, 3}, {9, 0}, {12, 2}},
                             {{7, 0}, {30, 5}, {40, 0}})));
  // A zero-length span between two contiguous spans does not stop merging.
  EXPECT_EQ((std::vector<RunTuple>{{0, 10, 4}}),
            AsTuples(ZipRuns({{0, 2}, {5, 0}, {2, 2}}, {{10, 0}, {10, 4}})));
  // Trailing empty spans.
  EXPECT_EQ((std::vector<RunTuple>{{0, 0, 2}}),
            AsTuples(ZipRuns({{0, 2}, {9, 0}}, {{0, 2}, {3, 0}, {4, 0}})));
}

TEST(ZipRunsTest, EmptyInputGivesNoRuns) {
  EXPECT_TRUE(ZipRuns({}, {}).empty());
  EXPECT_TRUE(ZipRuns({{3, 0}}, {{4, 0}, {5, 0}}).empty());
}

TEST(ZipRunsTest, PairsEveryTokenInOrderWithMaximalRuns) {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    // Random spans (some empty, some adjacent) on each side, equal totals.
    std::vector<SlotSpan> host, device;
    uint64_t total = 0, next = 0, i = 0;
    while (total < 40) {
      const uint64_t n = PatternByte(i++, seed) % 6;
      next += PatternByte(i++, seed) % 3;  // gap 0..2
      host.push_back({next, n});
      next += n;
      total += n;
    }
    uint64_t left = total, dnext = 1000;
    while (left > 0) {
      const uint64_t n = std::min<uint64_t>(left, PatternByte(i++, seed) % 7);
      dnext += PatternByte(i++, seed) % 2;
      device.push_back({dnext, n});
      dnext += n;
      left -= n;
    }
    const std::vector<TokenRun> runs = ZipRuns(host, device);
    std::vector<uint64_t> run_host, run_device;
    for (size_t r = 0; r < runs.size(); ++r) {
      ASSERT_GT(runs[r].num_tokens, 0u);
      for (uint64_t t = 0; t < runs[r].num_tokens; ++t) {
        run_host.push_back(runs[r].host_token + t);
        run_device.push_back(runs[r].device_token + t);
      }
      if (r > 0) {
        const TokenRun& prev = runs[r - 1];
        ASSERT_FALSE(prev.host_token + prev.num_tokens == runs[r].host_token &&
                     prev.device_token + prev.num_tokens ==
                         runs[r].device_token)
            << "runs " << r - 1 << " and " << r << " should have merged";
      }
    }
    ASSERT_EQ(Expand(host), run_host);
    ASSERT_EQ(Expand(device), run_device);
  }
}

TEST(CopyTaskTest, IndexRunsFillsPrefixSums) {
  CopyTask task;
  task.runs = {{0, 0, 3}, {10, 20, 5}, {40, 4, 1}};
  task.IndexRuns();
  EXPECT_EQ((std::vector<uint64_t>{0, 3, 8}), task.run_starts);
  EXPECT_EQ(9u, task.total_tokens);
  task.runs.clear();
  task.IndexRuns();
  EXPECT_TRUE(task.run_starts.empty());
  EXPECT_EQ(0u, task.total_tokens);
}

// ---------------------------------------------------------------------------
// Copies through CopyLayerSlice and CpuCopyEngine.

// Compares two buffers, naming the first differing byte.
::testing::AssertionResult SameBytes(const std::string& what,
                                     const std::vector<uint8_t>& expected,
                                     const std::vector<uint8_t>& actual) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure() << what << ": size " << actual.size()
                                         << ", expected " << expected.size();
  }
  if (expected == actual) return ::testing::AssertionSuccess();
  uint64_t diffs = 0, first = 0;
  for (uint64_t i = 0; i < expected.size(); ++i) {
    if (expected[i] != actual[i] && diffs++ == 0) first = i;
  }
  if (diffs == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << diffs << " of " << expected.size()
         << " bytes differ; first at byte " << first << ": expected "
         << int{expected[first]} << ", got " << int{actual[first]};
}

// A host pool and one engine's device buffers.
struct Buffers {
  std::vector<uint8_t> host;
  std::vector<std::array<std::vector<uint8_t>, 2>> device;  // [layer][kv]

  Buffers(const ReferencePool& pool, const ReferenceDevice& dev) {
    host = PatternBuffer(pool.TotalBytes(), 7);
    device.resize(pool.spec().layers);
    for (uint64_t l = 0; l < device.size(); ++l) {
      for (uint64_t kv = 0; kv < pool.planes(); ++kv) {
        device[l][kv] = PatternBuffer(dev.BufferBytes(), 100 + 2 * l + kv);
      }
    }
  }

  // The engine's per-layer base pointers (V null for MLA).
  std::vector<LayerBuffers> Table() {
    std::vector<LayerBuffers> table(device.size());
    for (size_t l = 0; l < device.size(); ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        table[l].plane[kv] =
            device[l][kv].empty() ? nullptr : device[l][kv].data();
      }
    }
    return table;
  }

  ::testing::AssertionResult Equals(const Buffers& expected) const {
    ::testing::AssertionResult same =
        SameBytes("host pool", expected.host, host);
    if (!same) return same;
    for (size_t l = 0; l < device.size(); ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        same = SameBytes("device layer " + std::to_string(l) + " plane " +
                             std::to_string(kv),
                         expected.device[l][kv], device[l][kv]);
        if (!same) return same;
      }
    }
    return ::testing::AssertionSuccess();
  }
};


std::string MechanismName(CopyMechanism m) {
  return m == CopyMechanism::kKernel ? "kernel" : "direct";
}

struct CopyCase {
  PoolSpec spec;
  CopyMechanism mechanism;
  size_t threads;
};

std::vector<CopyCase> AllCopyCases() {
  std::vector<CopyCase> cases;
  for (const PoolSpec& spec : reference::AllSmallPools(5)) {
    for (CopyMechanism m : {CopyMechanism::kKernel, CopyMechanism::kDirect}) {
      for (size_t threads : {1, 4}) cases.push_back({spec, m, threads});
    }
  }
  return cases;
}

class CopyEngineTest : public ::testing::TestWithParam<CopyCase> {
 protected:
  CopyEngineTest()
      : spec_(GetParam().spec),
        pool_(spec_),
        g_(reference::ToGeometry(spec_)),
        device_slots_(8 * spec_.page_size + 4),
        device_(spec_, device_slots_),
        workers_(GetParam().threads),
        engine_(&workers_) {}

  CopyTask MakeTask(const Selection& s, CopyDirection direction,
                    Buffers* buffers, const std::vector<LayerBuffers>* table) {
    CopyTask task;
    task.geometry = g_;
    task.host_base = buffers->host.data();
    task.layers = table->data();
    task.runs = ZipRuns(s.host, s.device);
    task.IndexRuns();
    task.direction = direction;
    task.mechanism = GetParam().mechanism;
    return task;
  }

  void ReferenceCopy(const Selection& s, bool to_device, uint32_t layer,
                     Buffers* b) const {
    uint8_t* planes[2] = {b->device[layer][0].data(),
                          b->device[layer][1].data()};
    reference::ReferenceCopyLayer(pool_, device_, to_device, layer,
                                  Expand(s.host), Expand(s.device),
                                  b->host.data(), planes);
  }

  const PoolSpec spec_;
  const ReferencePool pool_;
  const PoolGeometry g_;
  const uint64_t device_slots_;
  const ReferenceDevice device_;
  WorkerPool workers_;
  CpuCopyEngine engine_;
};

TEST_P(CopyEngineTest, LoadCopiesOneLayerAtATime) {
  for (const Selection& s : Selections(spec_.page_size)) {
    SCOPED_TRACE(s.name);
    Buffers actual(pool_, device_);
    Buffers expected = actual;
    const std::vector<LayerBuffers> table = actual.Table();
    const CopyTask task =
        MakeTask(s, CopyDirection::kHostToDevice, &actual, &table);
    ASSERT_EQ(4 * spec_.page_size, task.total_tokens);
    for (uint32_t layer = 0; layer < spec_.layers; ++layer) {
      SCOPED_TRACE("after layer " + std::to_string(layer));
      engine_.CopyLayer(task, layer);
      ReferenceCopy(s, /*to_device=*/true, layer, &expected);
      // Only this layer's targeted slots changed; later layers still hold
      // their old bytes and the host pool is untouched.
      ASSERT_TRUE(actual.Equals(expected));
    }
  }
}

TEST_P(CopyEngineTest, BackupCopiesEveryLayer) {
  for (const Selection& s : Selections(spec_.page_size)) {
    SCOPED_TRACE(s.name);
    Buffers actual(pool_, device_);
    Buffers expected = actual;
    const std::vector<LayerBuffers> table = actual.Table();
    const CopyTask task =
        MakeTask(s, CopyDirection::kDeviceToHost, &actual, &table);
    for (uint32_t layer = 0; layer < spec_.layers; ++layer) {
      engine_.CopyLayer(task, layer);
      ReferenceCopy(s, /*to_device=*/false, layer, &expected);
    }
    ASSERT_TRUE(actual.Equals(expected));
  }
}

// CopyLayers walks a backup in the host pool's order (host_order_copy.h):
// the same bytes as a per-layer copy, for every layer and for a range.
TEST_P(CopyEngineTest, BackupOfManyLayersMatchesPerLayerCopies) {
  for (const Selection& s : Selections(spec_.page_size)) {
    SCOPED_TRACE(s.name);
    for (uint32_t first : {0u, 1u}) {
      if (first == 1 && spec_.layers < 3) continue;
      const uint32_t last = first == 0 ? spec_.layers : spec_.layers - 1;
      Buffers actual(pool_, device_);
      Buffers expected = actual;
      const std::vector<LayerBuffers> table = actual.Table();
      const CopyTask task =
          MakeTask(s, CopyDirection::kDeviceToHost, &actual, &table);
      std::vector<uint32_t> done;
      std::mutex mu;
      ASSERT_OK(engine_.CopyLayers(task, first, last, [] { return true; },
                                   [&](uint32_t layer) {
                                     std::lock_guard<std::mutex> lock(mu);
                                     done.push_back(layer);
                                   }));
      std::sort(done.begin(), done.end());
      std::vector<uint32_t> want;
      for (uint32_t layer = first; layer < last; ++layer) {
        want.push_back(layer);
        ReferenceCopy(s, /*to_device=*/false, layer, &expected);
      }
      EXPECT_EQ(want, done);
      ASSERT_TRUE(actual.Equals(expected));
      // The host-order walk itself, for every layout, in two slices.
      Buffers direct(pool_, device_);
      const std::vector<LayerBuffers> direct_table = direct.Table();
      const CopyTask direct_task =
          MakeTask(s, CopyDirection::kDeviceToHost, &direct, &direct_table);
      const uint64_t half = direct_task.total_tokens / 2 + 1;
      CopyHostOrderSlice(direct_task, first, last, 0, half);
      CopyHostOrderSlice(direct_task, first, last, half,
                         direct_task.total_tokens);
      ASSERT_TRUE(direct.Equals(expected));
    }
  }
}

TEST_P(CopyEngineTest, BackupThenLoadElsewhereMovesTheTokens) {
  // Back up device slots into host pages, then load those host pages into
  // other device slots: the tokens arrive unchanged.
  const uint64_t ps = spec_.page_size;
  const Selection backup{"backup", {{2 * ps, ps}, {0, ps}}, {{ps + 1, 2 * ps}}};
  const Selection load{"load", {{2 * ps, ps}, {0, ps}}, {{5 * ps, 2 * ps}}};
  Buffers b(pool_, device_);
  const std::vector<LayerBuffers> table = b.Table();
  const CopyTask out =
      MakeTask(backup, CopyDirection::kDeviceToHost, &b, &table);
  const CopyTask in = MakeTask(load, CopyDirection::kHostToDevice, &b, &table);
  const auto before = b.device;
  for (uint32_t layer = 0; layer < spec_.layers; ++layer) {
    engine_.CopyLayer(out, layer);
  }
  for (uint32_t layer = 0; layer < spec_.layers; ++layer) {
    engine_.CopyLayer(in, layer);
    for (uint32_t kv = 0; kv < pool_.planes(); ++kv) {
      const uint64_t row = device_.ByteOffset(1, 0, 0);  // bytes per slot
      for (uint64_t t = 0; t < 2 * ps; ++t) {
        const auto src = before[layer][kv].begin() + (ps + 1 + t) * row;
        const auto dst = b.device[layer][kv].begin() + (5 * ps + t) * row;
        ASSERT_TRUE(std::equal(src, src + row, dst))
            << "layer " << layer << " plane " << kv << " token " << t;
      }
    }
  }
}

TEST_P(CopyEngineTest, SlicesGiveTheSameBytesAsOneCopy) {
  for (CopyDirection direction :
       {CopyDirection::kHostToDevice, CopyDirection::kDeviceToHost}) {
    for (const Selection& s : Selections(spec_.page_size)) {
      SCOPED_TRACE(s.name);
      Buffers sliced(pool_, device_);
      Buffers whole = sliced, expected = sliced;
      const std::vector<LayerBuffers> sliced_table = sliced.Table();
      const std::vector<LayerBuffers> whole_table = whole.Table();
      const CopyTask sliced_task =
          MakeTask(s, direction, &sliced, &sliced_table);
      const CopyTask whole_task = MakeTask(s, direction, &whole, &whole_table);
      const uint64_t n = sliced_task.total_tokens;
      // Cuts inside runs and pages, at run ends, plus an empty slice.
      std::vector<uint64_t> cuts = {0,     1, spec_.page_size + 3, n / 2, n / 2,
                                    n - 1, n};
      for (uint64_t& c : cuts) c = std::min(c, n);
      std::sort(cuts.begin(), cuts.end());
      for (uint32_t layer = 0; layer < spec_.layers; ++layer) {
        for (size_t i = 0; i + 1 < cuts.size(); ++i) {
          CopyLayerSlice(sliced_task, layer, cuts[i], cuts[i + 1]);
        }
        CopyLayerSlice(whole_task, layer, 0, n);
        ReferenceCopy(s, direction == CopyDirection::kHostToDevice, layer,
                      &expected);
      }
      ASSERT_TRUE(whole.Equals(expected));
      ASSERT_TRUE(sliced.Equals(expected));
    }
  }
}

TEST_P(CopyEngineTest, EmptyTaskCopiesNothing) {
  Buffers actual(pool_, device_);
  Buffers expected = actual;
  const std::vector<LayerBuffers> table = actual.Table();
  const Selection none{"none", {}, {}};
  for (CopyDirection direction :
       {CopyDirection::kHostToDevice, CopyDirection::kDeviceToHost}) {
    const CopyTask task = MakeTask(none, direction, &actual, &table);
    for (uint32_t layer = 0; layer < spec_.layers; ++layer) {
      engine_.CopyLayer(task, layer);
      CopyLayerSlice(task, layer, 0, 0);
    }
  }
  EXPECT_TRUE(actual.Equals(expected));
}

// The CPU backend copies pieces coalesced whatever the mechanism
// (CopyLayerSlice asks ForEachPiece for Coalesce::kAlways): a KERNEL task's
// pieces there are the DIRECT task's, maximal, and cover the same bytes.
TEST_P(CopyEngineTest, OnTheCpuEveryMechanismCopiesMaximalPieces) {
  for (const Selection& s : Selections(spec_.page_size)) {
    SCOPED_TRACE(s.name);
    Buffers actual(pool_, device_);
    const std::vector<LayerBuffers> table = actual.Table();
    CopyTask task = MakeTask(s, CopyDirection::kHostToDevice, &actual, &table);
    for (uint32_t layer = 0; layer < spec_.layers; ++layer) {
      for (uint32_t kv = 0; kv < g_.kv_planes(); ++kv) {
        std::vector<CopyPiece> always, direct;
        ForEachPiece(task, layer, kv, 0, task.total_tokens,
                     [&](const CopyPiece& p) { always.push_back(p); },
                     Coalesce::kAlways);
        const CopyMechanism mechanism = task.mechanism;
        task.mechanism = CopyMechanism::kDirect;
        ForEachPiece(task, layer, kv, 0, task.total_tokens,
                     [&](const CopyPiece& p) { direct.push_back(p); });
        task.mechanism = mechanism;
        ASSERT_EQ(always.size(), direct.size());
        for (size_t i = 0; i < always.size(); ++i) {
          EXPECT_EQ(always[i].host, direct[i].host);
          EXPECT_EQ(always[i].device, direct[i].device);
          EXPECT_EQ(always[i].bytes, direct[i].bytes);
        }
      }
    }
  }
}

// LayerPieces is what the GPU copy-engine path hands to cudaMemcpyBatchAsync
// (one batch per layer): applied with memcpy here, the pieces must move
// exactly the reference bytes; DIRECT pieces must be maximal, KERNEL pieces
// one chunk each.
TEST_P(CopyEngineTest, LayerPiecesAreExactlyTheBytesToMove) {
  for (const Selection& s : Selections(spec_.page_size)) {
    for (const bool to_device : {true, false}) {
      SCOPED_TRACE(s.name + (to_device ? " load" : " backup"));
      Buffers actual(pool_, device_);
      Buffers expected = actual;
      const std::vector<LayerBuffers> table = actual.Table();
      const CopyTask task = MakeTask(
          s, to_device ? CopyDirection::kHostToDevice : CopyDirection::kDeviceToHost,
          &actual, &table);
      for (uint32_t layer = 0; layer < spec_.layers; ++layer) {
        for (uint32_t kv = 0; kv < g_.kv_planes(); ++kv) {
          const std::vector<CopyPiece> pieces = LayerPieces(task, layer, kv);
          uint64_t bytes = 0;
          for (size_t i = 0; i < pieces.size(); ++i) {
            const CopyPiece& p = pieces[i];
            bytes += p.bytes;
            ASSERT_LE(p.host + p.bytes, actual.host.size());
            ASSERT_LE(p.device + p.bytes, actual.device[layer][kv].size());
            if (GetParam().mechanism == CopyMechanism::kKernel) {
              ASSERT_EQ(g_.chunk_bytes(), p.bytes) << "piece " << i;
            } else if (i > 0) {
              const CopyPiece& q = pieces[i - 1];
              ASSERT_FALSE(q.host + q.bytes == p.host &&
                           q.device + q.bytes == p.device)
                  << "pieces " << i - 1 << " and " << i << " should merge";
            }
            uint8_t* host = actual.host.data() + p.host;
            uint8_t* device = actual.device[layer][kv].data() + p.device;
            if (to_device) {
              std::memcpy(device, host, p.bytes);
            } else {
              std::memcpy(host, device, p.bytes);
            }
          }
          ASSERT_EQ(task.total_tokens * g_.token_stride(), bytes);
        }
        ReferenceCopy(s, to_device, layer, &expected);
        ASSERT_TRUE(actual.Equals(expected)) << "after layer " << layer;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, CopyEngineTest,
                         ::testing::ValuesIn(AllCopyCases()),
                         [](const ::testing::TestParamInfo<CopyCase>& info) {
                           return reference::SpecName(info.param.spec) + "_" +
                                  MechanismName(info.param.mechanism) + "_t" +
                                  std::to_string(info.param.threads);
                         });

// ---------------------------------------------------------------------------
// Layers big enough for CpuCopyEngine to split them over the workers.

using LargeCase = std::tuple<Attention, HostLayout, CopyMechanism>;

class LargeLayerCopyTest : public ::testing::TestWithParam<LargeCase> {
 protected:
  static constexpr uint64_t kPageSize = 64;
  static constexpr uint64_t kHostPages = 12;
  static constexpr uint64_t kDevicePages = 16;
  static constexpr uint64_t kMovedPages = 8;  // 512 tokens, > 1 MiB a layer
  static constexpr uint32_t kLayer = 1;

  static PoolSpec Spec() {
    PoolSpec s;
    s.attention = std::get<0>(GetParam());
    s.layout = std::get<1>(GetParam());
    s.layers = 2;
    s.heads = s.attention == Attention::kMha ? 4 : 1;
    s.dim = s.attention == Attention::kMha ? 64 : 576;
    s.itemsize = 4;
    s.page_size = kPageSize;
    s.size = kHostPages * kPageSize;
    return s;
  }

  // Host pages (7i + 3) % 12 to device pages (5i + 1) % 16.
  static Selection Scattered() {
    Selection s{"scattered", {}, {}};
    for (uint64_t i = 0; i < kMovedPages; ++i) {
      s.host.push_back({(7 * i + 3) % kHostPages * kPageSize, kPageSize});
      s.device.push_back({(5 * i + 1) % kDevicePages * kPageSize, kPageSize});
    }
    return s;
  }
};

TEST_P(LargeLayerCopyTest, FourWorkersMatchTheReference) {
  const PoolSpec spec = Spec();
  const ReferencePool pool(spec);
  const ReferenceDevice device(spec, kDevicePages * kPageSize);
  const Selection s = Scattered();
  WorkerPool workers(4);
  CpuCopyEngine engine(&workers);
  for (CopyDirection direction :
       {CopyDirection::kHostToDevice, CopyDirection::kDeviceToHost}) {
    const bool to_device = direction == CopyDirection::kHostToDevice;
    SCOPED_TRACE(to_device ? "load" : "backup");
    Buffers actual(pool, device);
    Buffers expected = actual;
    const std::vector<LayerBuffers> table = actual.Table();
    CopyTask task;
    task.geometry = reference::ToGeometry(spec);
    task.host_base = actual.host.data();
    task.layers = table.data();
    task.runs = ZipRuns(s.host, s.device);
    task.IndexRuns();
    task.direction = direction;
    task.mechanism = std::get<2>(GetParam());
    // At least 256 KiB per shard: the layer is split four ways.
    ASSERT_GE(task.total_tokens * task.geometry.token_stride() *
                  task.geometry.kv_planes(),
              4u * 256 * 1024);
    engine.CopyLayer(task, kLayer);
    uint8_t* planes[2] = {expected.device[kLayer][0].data(),
                          expected.device[kLayer][1].data()};
    reference::ReferenceCopyLayer(pool, device, to_device, kLayer,
                                  Expand(s.host), Expand(s.device),
                                  expected.host.data(), planes);
    ASSERT_TRUE(actual.Equals(expected));
  }
}

std::vector<LargeCase> AllLargeCases() {
  std::vector<LargeCase> cases;
  for (Attention attention : {Attention::kMha, Attention::kMla}) {
    for (HostLayout layout : reference::AllLayouts()) {
      if (!reference::LayoutDefined(attention, layout)) continue;
      for (CopyMechanism m : {CopyMechanism::kKernel, CopyMechanism::kDirect}) {
        cases.emplace_back(attention, layout, m);
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, LargeLayerCopyTest,
                         ::testing::ValuesIn(AllLargeCases()),
                         [](const ::testing::TestParamInfo<LargeCase>& info) {
                           return std::string(std::get<0>(info.param) ==
                                                      Attention::kMha
                                                  ? "mha_"
                                                  : "mla_") +
                                  HostLayoutName(std::get<1>(info.param)) +
                                  "_" + MechanismName(std::get<2>(info.param));
                         });

}  // namespace
}  // namespace hostkv
