// The copy kernel's address math and warp split, run on the CPU by
// RunKernelCopyOnCpu, checked byte for byte against the reference layout
// model for every layout, page size and direction; plus the vector widths it
// picks, BuildTokenIndex and the grid size.
#include "kernels/kernel_copy_plan.h"

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/copy_plan.h"
#include "kernels/pool_geometry.h"
#include "tests/kernels/byte_compare.h"
#include "tests/kernels/reference_layout.h"
#include "tests/kernels/transfer_selections.h"

namespace hostkv {
namespace {

using reference::PatternBuffer;
using reference::PoolSpec;
using reference::ReferenceDevice;
using reference::ReferencePool;


// A pattern-filled host pool and one engine's device buffers. The pool
// starts `shift` bytes into its allocation (which is 16-byte aligned), so
// that a test can misalign it.
struct Buffers {
  std::vector<uint8_t> host_alloc;
  uint64_t shift;
  uint64_t host_bytes;
  std::vector<std::array<std::vector<uint8_t>, 2>> device;  // [layer][kv]

  Buffers(const ReferencePool& pool, const ReferenceDevice& dev, uint64_t s)
      : host_alloc(PatternBuffer(pool.TotalBytes() + s, 7)),
        shift(s),
        host_bytes(pool.TotalBytes()),
        device(pool.spec().layers) {
    for (uint64_t l = 0; l < device.size(); ++l) {
      for (uint64_t kv = 0; kv < pool.planes(); ++kv) {
        device[l][kv] = PatternBuffer(dev.BufferBytes(), 100 + 2 * l + kv);
      }
    }
  }

  uint8_t* host() { return host_alloc.data() + shift; }
  uint8_t* plane(uint32_t layer, int kv) {
    return device[layer][kv].empty() ? nullptr : device[layer][kv].data();
  }

  ::testing::AssertionResult Equals(const Buffers& expected) const {
    auto same = SameBytes("host pool", expected.host_alloc.data(),
                          host_alloc.data(), host_alloc.size());
    for (size_t l = 0; same && l < device.size(); ++l) {
      for (int kv = 0; same && kv < 2; ++kv) {
        same = SameBytes("device layer " + std::to_string(l) + " plane " +
                             std::to_string(kv),
                         expected.device[l][kv].data(), device[l][kv].data(),
                         device[l][kv].size());
      }
    }
    return same;
  }
};


constexpr uint64_t kHostPages = 5;
uint64_t DeviceSlots(const PoolSpec& spec) { return 8 * spec.page_size + 4; }

// One pool spec with its reference model.
struct Model {
  explicit Model(const PoolSpec& s)
      : spec(s),
        pool(s),
        device(s, DeviceSlots(s)),
        g(reference::ToGeometry(s)) {}
  const PoolSpec spec;
  const ReferencePool pool;
  const ReferenceDevice device;
  const PoolGeometry g;
};

KernelCopyArgs MakeArgs(const PoolGeometry& g, Buffers* b,
                        const TokenIndex& index, uint32_t layer,
                        CopyDirection direction) {
  KernelCopyArgs args;
  args.geometry = g;
  args.host_base = b->host();
  args.device_plane[0] = b->plane(layer, 0);
  args.device_plane[1] = b->plane(layer, 1);
  args.host_tokens = index.host_tokens.data();
  args.device_tokens = index.device_tokens.data();
  args.num_tokens = index.host_tokens.size();
  args.layer = layer;
  args.direction = direction;
  return args;
}

// The vector widths the kernel uses for the chunks of `args`.
std::set<uint32_t> WidthsUsed(const KernelCopyArgs& args) {
  std::set<uint32_t> widths;
  for (uint64_t row = 0; row < KernelCopyRows(args); ++row) {
    for (uint32_t c = 0; c < args.geometry.chunks_per_row(); ++c) {
      const KernelChunk chunk = KernelChunkAt(args, row, c);
      widths.insert(KernelVectorWidth(chunk.src, chunk.dst, chunk.bytes));
    }
  }
  return widths;
}

// Copies `s` layer by layer with RunKernelCopyOnCpu and with the reference
// model, comparing every byte of both sides after each layer. Returns the
// vector widths used.
std::set<uint32_t> CheckAgainstReference(const Model& m, const Selection& s,
                                         CopyDirection direction,
                                         uint64_t host_shift = 0) {
  SCOPED_TRACE(s.name + (direction == CopyDirection::kHostToDevice
                             ? " load"
                             : " backup"));
  Buffers actual(m.pool, m.device, host_shift);
  Buffers expected = actual;
  const TokenIndex index = BuildTokenIndex(ZipRuns(s.host, s.device));
  std::set<uint32_t> widths;
  for (uint32_t layer = 0; layer < m.spec.layers; ++layer) {
    const KernelCopyArgs args = MakeArgs(m.g, &actual, index, layer, direction);
    for (uint32_t w : WidthsUsed(args)) widths.insert(w);
    RunKernelCopyOnCpu(args);
    uint8_t* planes[2] = {expected.plane(layer, 0), expected.plane(layer, 1)};
    reference::ReferenceCopyLayer(
        m.pool, m.device, direction == CopyDirection::kHostToDevice, layer,
        index.host_tokens, index.device_tokens, expected.host(), planes);
    EXPECT_TRUE(actual.Equals(expected)) << "after layer " << layer;
  }
  return widths;
}

// ---------------------------------------------------------------------------
// Every layout, page size and model shape.

class KernelCopyPlanTest : public ::testing::TestWithParam<PoolSpec> {
 protected:
  const Model m_{GetParam()};
};

TEST_P(KernelCopyPlanTest, LoadMatchesTheReference) {
  for (const Selection& s : Selections(m_.spec.page_size)) {
    CheckAgainstReference(m_, s, CopyDirection::kHostToDevice);
  }
}

TEST_P(KernelCopyPlanTest, BackupMatchesTheReference) {
  for (const Selection& s : Selections(m_.spec.page_size)) {
    CheckAgainstReference(m_, s, CopyDirection::kDeviceToHost);
  }
}

TEST_P(KernelCopyPlanTest, EmptyCopyTouchesNothing) {
  Buffers actual(m_.pool, m_.device, 0);
  const Buffers before = actual;
  for (CopyDirection direction :
       {CopyDirection::kHostToDevice, CopyDirection::kDeviceToHost}) {
    for (uint32_t layer = 0; layer < m_.spec.layers; ++layer) {
      KernelCopyArgs args =
          MakeArgs(m_.g, &actual, TokenIndex{}, layer, direction);
      args.host_tokens = nullptr;  // never read
      args.device_tokens = nullptr;
      EXPECT_EQ(0u, KernelCopyRows(args));
      RunKernelCopyOnCpu(args);
    }
  }
  EXPECT_TRUE(actual.Equals(before));
}

INSTANTIATE_TEST_SUITE_P(
    AllLayouts, KernelCopyPlanTest,
    ::testing::ValuesIn(reference::AllSmallPools(kHostPages)),
    [](const ::testing::TestParamInfo<PoolSpec>& info) {
      return reference::SpecName(info.param);
    });

// ---------------------------------------------------------------------------
// Vector widths: head sizes (dim * itemsize) that allow exactly one width
// for every chunk, with three heads (MHA) so that rows are 3 heads long.

struct WidthCase {
  Attention attention;
  HostLayout layout;
  uint64_t dim;
  uint64_t itemsize;
  uint32_t width;  // expected for every chunk
};

std::vector<WidthCase> AllWidthCases() {
  struct Head {
    uint64_t dim, itemsize;
    uint32_t width;
  };
  // 256 bytes (a bf16 head of 128), 8, 4, 6 and 3 bytes.
  const Head heads[] = {
      {128, 2, 16}, {4, 2, 8}, {2, 2, 4}, {3, 2, 2}, {3, 1, 1}};
  std::vector<WidthCase> cases;
  for (Attention attention : {Attention::kMha, Attention::kMla}) {
    for (HostLayout layout : reference::AllLayouts()) {
      if (!reference::LayoutDefined(attention, layout)) continue;
      for (const Head& h : heads) {
        cases.push_back({attention, layout, h.dim, h.itemsize, h.width});
      }
    }
  }
  return cases;
}

PoolSpec WidthSpec(Attention attention, HostLayout layout, uint64_t dim,
                   uint64_t itemsize) {
  PoolSpec s;
  s.attention = attention;
  s.layout = layout;
  s.layers = 2;
  s.heads = attention == Attention::kMha ? 3 : 1;
  s.dim = dim;
  s.itemsize = itemsize;
  s.page_size = 16;
  s.size = kHostPages * s.page_size;
  return s;
}

class VectorWidthTest : public ::testing::TestWithParam<WidthCase> {};

TEST_P(VectorWidthTest, EveryChunkUsesTheWidestAlignedVector) {
  const WidthCase& c = GetParam();
  const Model m(WidthSpec(c.attention, c.layout, c.dim, c.itemsize));
  for (CopyDirection direction :
       {CopyDirection::kHostToDevice, CopyDirection::kDeviceToHost}) {
    for (const Selection& s : Selections(m.spec.page_size)) {
      EXPECT_EQ(std::set<uint32_t>{c.width},
                CheckAgainstReference(m, s, direction));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, VectorWidthTest,
                         ::testing::ValuesIn(AllWidthCases()),
                         [](const ::testing::TestParamInfo<WidthCase>& info) {
                           const WidthCase& c = info.param;
                           return std::string(c.attention == Attention::kMha
                                                  ? "mha_"
                                                  : "mla_") +
                                  HostLayoutName(c.layout) + "_head" +
                                  std::to_string(c.dim * c.itemsize) + "_w" +
                                  std::to_string(c.width);
                         });

TEST(KernelVectorWidthTest, MisalignedHostPoolNarrowsTheVectors) {
  // 256-byte heads would take 16-byte vectors; a pool starting `shift`
  // bytes off 16-byte alignment limits them to the shift's alignment.
  const Model m(WidthSpec(Attention::kMha, HostLayout::kPageHead, 128, 2));
  for (uint32_t shift : {1u, 2u, 4u, 8u, 12u}) {
    SCOPED_TRACE("shift " + std::to_string(shift));
    const uint32_t width = shift & -shift;  // lowest set bit
    for (CopyDirection direction :
         {CopyDirection::kHostToDevice, CopyDirection::kDeviceToHost}) {
      EXPECT_EQ(std::set<uint32_t>{width},
                CheckAgainstReference(m, Selections(16)[1], direction, shift));
    }
  }
}

TEST(KernelVectorWidthTest, WidestCommonDivisorOfAddressesAndSize) {
  alignas(16) uint8_t buf[64];
  EXPECT_EQ(16u, KernelVectorWidth(buf, buf + 32, 48));
  EXPECT_EQ(16u, KernelVectorWidth(buf, buf, 0));
  EXPECT_EQ(8u, KernelVectorWidth(buf + 8, buf, 32));
  EXPECT_EQ(8u, KernelVectorWidth(buf, buf + 16, 24));
  EXPECT_EQ(4u, KernelVectorWidth(buf, buf + 4, 16));
  EXPECT_EQ(4u, KernelVectorWidth(buf + 12, buf, 12));
  EXPECT_EQ(2u, KernelVectorWidth(buf, buf, 6));
  EXPECT_EQ(2u, KernelVectorWidth(buf + 2, buf + 16, 16));
  EXPECT_EQ(1u, KernelVectorWidth(buf + 3, buf, 16));
  EXPECT_EQ(1u, KernelVectorWidth(buf, buf, 3));
}

// ---------------------------------------------------------------------------
// Rows, token index and grid.

TEST(KernelChunkAtTest, RowsAreEveryTokenOfKThenEveryTokenOfV) {
  // MHA layer_first (2, L=2, S=8, H=2, 4 bytes): plane 128 bytes, row 8.
  PoolGeometry g;
  g.attention = Attention::kMha;
  g.layout = HostLayout::kLayerFirst;
  g.num_layers = 2;
  g.num_heads = 2;
  g.head_bytes = 4;
  g.page_size = 1;
  g.token_slots = 8;
  uint8_t host[256], k[64], v[64];
  const uint64_t host_tokens[] = {5, 2};
  const uint64_t device_tokens[] = {1, 7};
  KernelCopyArgs a;
  a.geometry = g;
  a.host_base = host;
  a.device_plane[0] = k;
  a.device_plane[1] = v;
  a.host_tokens = host_tokens;
  a.device_tokens = device_tokens;
  a.num_tokens = 2;
  a.layer = 1;
  a.direction = CopyDirection::kHostToDevice;
  ASSERT_EQ(4u, KernelCopyRows(a));
  // Row 3: V plane, second token: host 128 + (1 * 8 + 2) * 8, device 7 * 8.
  KernelChunk c = KernelChunkAt(a, 3, 0);
  EXPECT_EQ(host + 208, c.src);
  EXPECT_EQ(v + 56, c.dst);
  EXPECT_EQ(8u, c.bytes);
  // Row 0: K plane, first token: host (8 + 5) * 8, device 1 * 8.
  a.direction = CopyDirection::kDeviceToHost;
  c = KernelChunkAt(a, 0, 0);
  EXPECT_EQ(k + 8, c.src);
  EXPECT_EQ(host + 104, c.dst);
}

TEST(BuildTokenIndexTest, ExpandsRunsInOrder) {
  const TokenIndex index =
      BuildTokenIndex({{3, 10, 2}, {0, 20, 1}, {8, 5, 3}, {40, 40, 0}});
  EXPECT_EQ((std::vector<uint64_t>{3, 4, 0, 8, 9, 10}), index.host_tokens);
  EXPECT_EQ((std::vector<uint64_t>{10, 11, 20, 5, 6, 7}), index.device_tokens);
  const TokenIndex empty = BuildTokenIndex({});
  EXPECT_TRUE(empty.host_tokens.empty());
  EXPECT_TRUE(empty.device_tokens.empty());
}

TEST(KernelCopyBlocksTest, OneWarpPerRowUpToTheLimit) {
  EXPECT_EQ(0u, KernelCopyBlocks(0, 0));
  EXPECT_EQ(1u, KernelCopyBlocks(1, 0));
  EXPECT_EQ(1u, KernelCopyBlocks(8, 0));
  EXPECT_EQ(2u, KernelCopyBlocks(9, 0));
  EXPECT_EQ(16u, KernelCopyBlocks(128, 0));
  EXPECT_EQ(16u, KernelCopyBlocks(1u << 20, 0));  // default limit
  EXPECT_EQ(4u, KernelCopyBlocks(1000, 4));
  EXPECT_EQ(2u, KernelCopyBlocks(9, 100));
  EXPECT_EQ(0x7fffffffu, KernelCopyBlocks(uint64_t{1} << 40, 0xffffffffu));
}

}  // namespace
}  // namespace hostkv
