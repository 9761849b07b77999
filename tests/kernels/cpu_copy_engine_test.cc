// CpuCopyEngine::CopyLayers: one pass over the workers for many layers, with
// a callback per finished layer.
#include "kernels/cpu_copy_engine.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/layout_offsets.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

class CopyLayersTest : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    g_.attention = Attention::kMha;
    g_.layout = HostLayout::kPageFirst;
    g_.num_layers = 6;
    g_.num_heads = 4;
    g_.head_bytes = 256;  // 1 KiB rows: big enough to use several workers
    g_.page_size = 16;
    g_.token_slots = 1024;
    host_.assign(g_.total_bytes(), 0);
    device_.assign(2 * g_.num_layers * kDeviceSlots * g_.token_stride(), 0);
    for (uint32_t l = 0; l < g_.num_layers; ++l) {
      layers_.push_back({{&device_[(2 * l) * kDeviceSlots * g_.token_stride()],
                          &device_[(2 * l + 1) * kDeviceSlots * g_.token_stride()]}});
    }
    for (size_t i = 0; i < device_.size(); ++i) device_[i] = static_cast<uint8_t>(i * 7 + 3);
    task_.geometry = g_;
    task_.host_base = host_.data();
    task_.layers = layers_.data();
    task_.runs = {{160, 0, 512}, {16, 512, 512}};  // host pages 10.., 1..
    task_.IndexRuns();
    task_.direction = CopyDirection::kDeviceToHost;
  }

  bool RowMatches(uint32_t kv, uint32_t l, uint64_t host_token, uint64_t slot) {
    return std::memcmp(&host_[HostChunkOffset(g_, kv, l, host_token, 0)],
                       layers_[l].plane[kv] + slot * g_.token_stride(),
                       g_.token_stride()) == 0;
  }

  static constexpr uint64_t kDeviceSlots = 1024;
  PoolGeometry g_;
  std::vector<uint8_t> host_, device_;
  std::vector<LayerBuffers> layers_;
  CopyTask task_;
};

TEST_P(CopyLayersTest, CopiesEveryLayerAndReportsEachOnce) {
  WorkerPool workers(GetParam());
  CpuCopyEngine engine(&workers);
  std::mutex mu;
  std::multiset<uint32_t> done;
  EXPECT_OK(engine.CopyLayers(task_, 1, 5, [] { return true; }, [&](uint32_t layer) {
    std::lock_guard<std::mutex> lock(mu);
    // Every earlier layer of the range is complete by now.
    for (uint32_t l = 1; l <= layer; ++l) {
      EXPECT_TRUE(RowMatches(1, l, 160 + 511, 511)) << "layer " << l;
    }
    done.insert(layer);
  }));
  EXPECT_EQ((std::multiset<uint32_t>{1, 2, 3, 4}), done);
  for (uint32_t l = 0; l < g_.num_layers; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const bool copied = l >= 1 && l < 5;
      EXPECT_EQ(copied, RowMatches(kv, l, 160, 0)) << l;
      EXPECT_EQ(copied, RowMatches(kv, l, 16 + 511, 1023)) << l;
    }
  }
}

TEST_P(CopyLayersTest, StopsWhenToldTo) {
  WorkerPool workers(GetParam());
  CpuCopyEngine engine(&workers);
  for (CopyDirection direction :
       {CopyDirection::kDeviceToHost, CopyDirection::kHostToDevice}) {
    task_.direction = direction;
    std::atomic<int> asked{0};
    std::atomic<int> reported{0};
    EXPECT_OK(engine.CopyLayers(
        task_, 0, g_.num_layers, [&] { return asked.fetch_add(1) < 2; },
        [&](uint32_t) { reported.fetch_add(1); }));
    EXPECT_LT(reported.load(), static_cast<int>(g_.num_layers));
    // The last token of the last layer is copied last, in either order.
    EXPECT_FALSE(RowMatches(0, g_.num_layers - 1, 16 + 511, 1023));
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, CopyLayersTest, ::testing::Values(1u, 2u, 4u));

}  // namespace
}  // namespace hostkv
