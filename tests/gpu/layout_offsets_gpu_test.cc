// The CUDA build of layout_offsets.h computes the same offsets as the CPU
// build, for every layout: the GPU copies and the CPU path share one
// definition of the byte placement.
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/layout_kernels.h"
#include "kernels/layout_offsets.h"

namespace hostkv {
namespace {

TEST(GpuLayoutOffsetsTest, MatchesTheCpuForEveryLayout) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  struct Case {
    Attention attention;
    HostLayout layout;
  };
  const Case cases[] = {
      {Attention::kMha, HostLayout::kLayerFirst},
      {Attention::kMha, HostLayout::kPageFirst},
      {Attention::kMha, HostLayout::kPageFirstDirect},
      {Attention::kMha, HostLayout::kPageHead},
      {Attention::kMla, HostLayout::kLayerFirst},
      {Attention::kMla, HostLayout::kPageFirst},
      {Attention::kMla, HostLayout::kPageFirstDirect},
  };
  for (const Case& c : cases) {
    for (uint32_t page_size : {1u, 16u, 64u}) {
      PoolGeometry g;
      g.attention = c.attention;
      g.layout = c.layout;
      g.num_layers = 5;
      g.num_heads = c.attention == Attention::kMha ? 3 : 1;
      g.head_bytes = c.attention == Attention::kMha ? 256 : 1152;
      g.page_size = page_size;
      g.token_slots = 4 * page_size;
      std::vector<ChunkCoord> coords;
      for (uint32_t kv = 0; kv < g.kv_planes(); ++kv)
        for (uint32_t l = 0; l < g.num_layers; ++l)
          for (uint64_t t = 0; t < g.token_slots; ++t)
            for (uint32_t ch = 0; ch < g.chunks_per_row(); ++ch)
              coords.push_back({kv, l, t, ch, 0});
      std::vector<uint64_t> gpu(coords.size());
      ASSERT_EQ(0, ComputeHostChunkOffsetsOnDevice(g, coords.data(), gpu.data(),
                                                   coords.size()));
      for (size_t i = 0; i < coords.size(); ++i) {
        const ChunkCoord& x = coords[i];
        ASSERT_EQ(HostChunkOffset(g, x.kv, x.layer, x.token, x.chunk), gpu[i])
            << HostLayoutName(c.layout) << " ps=" << page_size << " i=" << i;
      }
    }
  }
}

}  // namespace
}  // namespace hostkv
