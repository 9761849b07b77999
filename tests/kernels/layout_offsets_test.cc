// HostChunkOffset / DeviceChunkOffset and PoolGeometry's sizes, checked
// against an independent row-major model of SGLang's host pool tensors.
#include "kernels/layout_offsets.h"

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/pool_geometry.h"
#include "tests/kernels/reference_layout.h"

namespace hostkv {
namespace {

using reference::Coord;
using reference::PoolSpec;
using reference::ReferenceDevice;
using reference::ReferencePool;
using reference::RowMajorTensor;

// ---------------------------------------------------------------------------
// The reference model itself, against numbers worked out by hand.

TEST(RowMajorTensorTest, OffsetIsHornerOverTheShape) {
  RowMajorTensor t({2, 3, 4});
  EXPECT_EQ(24u, t.NumElements());
  EXPECT_EQ(0u, t.ElementOffset({0, 0, 0}));
  EXPECT_EQ(3u, t.ElementOffset({0, 0, 3}));
  EXPECT_EQ(4u, t.ElementOffset({0, 1, 0}));
  EXPECT_EQ(12u, t.ElementOffset({1, 0, 0}));
  EXPECT_EQ(23u, t.ElementOffset({1, 2, 3}));
  EXPECT_THROW(t.ElementOffset({0, 3, 0}), std::out_of_range);
}

TEST(RowMajorTensorTest, ForEachIndexWalksInRowMajorOrder) {
  RowMajorTensor t({2, 3, 4});
  std::vector<uint64_t> offsets;
  t.ForEachIndex([&](const std::vector<uint64_t>& index) {
    offsets.push_back(t.ElementOffset(index));
  });
  ASSERT_EQ(24u, offsets.size());
  for (uint64_t i = 0; i < offsets.size(); ++i) EXPECT_EQ(i, offsets[i]);
}

TEST(RowMajorTensorTest, SliceListsTheSlicedTensorFlattened) {
  // t[:, 1:3, :] of a (2, 4, 2) tensor.
  RowMajorTensor t({2, 4, 2});
  EXPECT_EQ((std::vector<uint64_t>{2, 3, 4, 5, 10, 11, 12, 13}),
            t.SliceElementOffsets(1, 1, 2));
  EXPECT_EQ((std::vector<uint64_t>{8, 9, 10, 11, 12, 13, 14, 15}),
            t.SliceElementOffsets(0, 1, 1));
}

PoolSpec Spec(Attention attention, HostLayout layout, uint64_t layers,
              uint64_t heads, uint64_t dim, uint64_t itemsize, uint64_t ps,
              uint64_t size) {
  PoolSpec s;
  s.attention = attention;
  s.layout = layout;
  s.layers = layers;
  s.heads = heads;
  s.dim = dim;
  s.itemsize = itemsize;
  s.page_size = ps;
  s.size = size;
  return s;
}

TEST(ReferencePoolTest, ShapesAreSglangs) {
  // L=3, H=2, D=8, ps=4, size=12 (P=3).
  auto shape = [](Attention a, HostLayout l) {
    const uint64_t heads = a == Attention::kMha ? 2 : 1;
    return ReferencePool(Spec(a, l, 3, heads, 8, 2, 4, 12)).tensor().shape();
  };
  using V = std::vector<uint64_t>;
  EXPECT_EQ((V{2, 3, 12, 2, 8}),
            shape(Attention::kMha, HostLayout::kLayerFirst));
  EXPECT_EQ((V{2, 12, 3, 2, 8}),
            shape(Attention::kMha, HostLayout::kPageFirst));
  EXPECT_EQ((V{2, 3, 3, 4, 2, 8}),
            shape(Attention::kMha, HostLayout::kPageFirstDirect));
  EXPECT_EQ((V{2, 3, 2, 4, 3, 8}),
            shape(Attention::kMha, HostLayout::kPageHead));
  EXPECT_EQ((V{3, 12, 1, 8}), shape(Attention::kMla, HostLayout::kLayerFirst));
  EXPECT_EQ((V{12, 3, 1, 8}), shape(Attention::kMla, HostLayout::kPageFirst));
  EXPECT_EQ((V{3, 3, 4, 1, 8}),
            shape(Attention::kMla, HostLayout::kPageFirstDirect));
  EXPECT_FALSE(
      reference::LayoutDefined(Attention::kMla, HostLayout::kPageHead));
}

TEST(ReferencePoolTest, HandComputedOffsets) {
  // MHA page_head (2, P=3, H=2, ps=4, L=3, D=8), itemsize 2: V, layer 1,
  // token 6 (page 1, slot 2), head 1, dim 5
  // -> ((((1*3 + 1)*2 + 1)*4 + 2)*3 + 1)*8 + 5 = 925 elements.
  ReferencePool page_head(
      Spec(Attention::kMha, HostLayout::kPageHead, 3, 2, 8, 2, 4, 12));
  EXPECT_EQ((std::vector<uint64_t>{1, 1, 1, 2, 1, 5}),
            page_head.IndexOf(Coord{1, 1, 6, 1, 5}));
  EXPECT_EQ(925u * 2, page_head.ByteOffset(Coord{1, 1, 6, 1, 5}));
  // MLA page_first (size=12, L=3, 1, kv_dim=8), itemsize 2: layer 2,
  // token 5, dim 7 -> (5*3 + 2)*8 + 7 = 143 elements.
  ReferencePool page_first(
      Spec(Attention::kMla, HostLayout::kPageFirst, 3, 1, 8, 2, 4, 12));
  EXPECT_EQ(143u * 2, page_first.ByteOffset(Coord{0, 2, 5, 0, 7}));
}

// ---------------------------------------------------------------------------
// The production layout math, for every defined layout and a few shapes.

// Where byte `byte` of element `c` sits relative to its chunk: page_head
// stores each head apart (chunk = head); every other layout stores the whole
// token row as one chunk.
struct ChunkPosition {
  uint32_t chunk;
  uint64_t byte_in_chunk;
};
ChunkPosition PositionInChunk(const PoolSpec& s, const Coord& c,
                              uint64_t byte) {
  if (s.layout == HostLayout::kPageHead) {
    return {static_cast<uint32_t>(c.head), c.dim * s.itemsize + byte};
  }
  return {0, (c.head * s.dim + c.dim) * s.itemsize + byte};
}

std::string Describe(const Coord& c, uint64_t byte) {
  std::ostringstream out;
  out << "(kv=" << c.kv << ", layer=" << c.layer << ", token=" << c.token
      << ", head=" << c.head << ", dim=" << c.dim << ", byte=" << byte << ")";
  return out.str();
}

class LayoutOffsetsTest : public ::testing::TestWithParam<PoolSpec> {
 protected:
  static constexpr uint64_t kPages = 3;

  LayoutOffsetsTest()
      : spec_(GetParam()), ref_(spec_), g_(reference::ToGeometry(spec_)) {}

  // Production offset of byte `byte` of element `c`.
  uint64_t ProductionOffset(const Coord& c, uint64_t byte) const {
    const ChunkPosition p = PositionInChunk(spec_, c, byte);
    return HostChunkOffset(g_, static_cast<uint32_t>(c.kv),
                           static_cast<uint32_t>(c.layer), c.token, p.chunk) +
           p.byte_in_chunk;
  }

  const PoolSpec spec_;
  const ReferencePool ref_;
  const PoolGeometry g_;
};

TEST_P(LayoutOffsetsTest, SizesMatchTheReferenceShape) {
  const uint64_t L = spec_.layers, H = spec_.heads, D = spec_.dim,
                 it = spec_.itemsize, ps = spec_.page_size;
  EXPECT_EQ(ref_.planes(), g_.kv_planes());
  EXPECT_EQ(ref_.TotalBytes(), g_.total_bytes());
  EXPECT_EQ(ref_.TotalBytes() / ref_.planes(), g_.plane_bytes());
  // REFERENCE "Sizing": MHA 2*L*H*D*it, MLA L*kv_dim*it.
  EXPECT_EQ(ref_.planes() * L * H * D * it, g_.bytes_per_token());
  EXPECT_EQ(ref_.TotalBytes() / spec_.size, g_.bytes_per_token());
  // A flat page (get_dummy_flat_data_page) has 2*L*ps*H*D elements.
  EXPECT_EQ(ref_.FlatPageElements() * it, g_.page_bytes());
  EXPECT_EQ(ref_.FlatPageByteOffsets(0).size() * it, g_.page_bytes());
  EXPECT_EQ(kPages, g_.num_pages());
  EXPECT_EQ(spec_.size / ps, g_.num_pages());
  // token_stride = H*D*it (MLA kv_dim*it).
  EXPECT_EQ(H * D * it, g_.token_stride());
  EXPECT_EQ(spec_.layout == HostLayout::kPageHead ? H : 1u,
            g_.chunks_per_row());
  EXPECT_EQ(H * D * it, g_.chunks_per_row() * g_.chunk_bytes());
}

TEST_P(LayoutOffsetsTest, EveryByteSitsAtItsReferenceOffset) {
  uint64_t checked = 0, mismatches = 0;
  std::string first_mismatch;
  ref_.ForEachCoord([&](const Coord& c) {
    const uint64_t expected = ref_.ByteOffset(c);
    for (uint64_t b = 0; b < spec_.itemsize; ++b) {
      const uint64_t actual = ProductionOffset(c, b);
      ++checked;
      if (actual != expected + b && mismatches++ == 0) {
        first_mismatch = Describe(c, b) + ": expected " +
                         std::to_string(expected + b) + ", got " +
                         std::to_string(actual);
      }
    }
  });
  EXPECT_EQ(ref_.TotalBytes(), checked);
  EXPECT_EQ(0u, mismatches) << "first: " << first_mismatch;
}

TEST_P(LayoutOffsetsTest, OffsetsAreABijectionOntoThePool) {
  const uint64_t total = g_.total_bytes();
  std::vector<uint32_t> hits(total, 0);
  uint64_t out_of_range = 0;
  ref_.ForEachCoord([&](const Coord& c) {
    for (uint64_t b = 0; b < spec_.itemsize; ++b) {
      const uint64_t offset = ProductionOffset(c, b);
      if (offset >= total) {
        ++out_of_range;
      } else {
        ++hits[offset];
      }
    }
  });
  EXPECT_EQ(0u, out_of_range);
  uint64_t bytes_hit_once = 0;
  for (uint32_t h : hits) bytes_hit_once += (h == 1);
  EXPECT_EQ(total, bytes_hit_once);
}

TEST_P(LayoutOffsetsTest, ChunkStartsAtItsFirstElement) {
  // Chunk c of a row starts at element (head c, dim 0) for page_head and at
  // (head 0, dim 0) otherwise, and lies inside the pool.
  for (uint32_t kv = 0; kv < ref_.planes(); ++kv) {
    for (uint32_t layer = 0; layer < spec_.layers; ++layer) {
      for (uint64_t token = 0; token < spec_.size; ++token) {
        for (uint32_t c = 0; c < g_.chunks_per_row(); ++c) {
          const uint64_t offset = HostChunkOffset(g_, kv, layer, token, c);
          ASSERT_LE(offset + g_.chunk_bytes(), g_.total_bytes());
          ASSERT_EQ(ref_.ByteOffset(Coord{kv, layer, token, c, 0}), offset)
              << "kv " << kv << " layer " << layer << " token " << token
              << " chunk " << c;
        }
      }
    }
  }
}

TEST_P(LayoutOffsetsTest, DeviceOffsetsMatchTheDeviceTensor) {
  const uint64_t slots = 2 * spec_.page_size + 3;
  ReferenceDevice device(spec_, slots);
  for (uint64_t t = 0; t < slots; ++t) {
    for (uint64_t h = 0; h < spec_.heads; ++h) {
      for (uint64_t d = 0; d < spec_.dim; ++d) {
        const ChunkPosition p = PositionInChunk(spec_, Coord{0, 0, t, h, d}, 0);
        ASSERT_EQ(device.ByteOffset(t, h, d),
                  DeviceChunkOffset(g_, t, p.chunk) + p.byte_in_chunk)
            << "slot " << t << " head " << h << " dim " << d;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, LayoutOffsetsTest,
                         ::testing::ValuesIn(reference::AllSmallPools(3)),
                         [](const ::testing::TestParamInfo<PoolSpec>& info) {
                           return reference::SpecName(info.param);
                         });

TEST(PoolGeometryTest, LayoutNames) {
  EXPECT_STREQ("layer_first", HostLayoutName(HostLayout::kLayerFirst));
  EXPECT_STREQ("page_first", HostLayoutName(HostLayout::kPageFirst));
  EXPECT_STREQ("page_first_direct",
               HostLayoutName(HostLayout::kPageFirstDirect));
  EXPECT_STREQ("page_head", HostLayoutName(HostLayout::kPageHead));
}

TEST(PoolGeometryTest, RealisticSizesMatchSglangFormulas) {
  // Llama-3-8B-like MHA: L=32, H=8, D=128, bf16; DeepSeek-like MLA: L=61,
  // kv_dim=576, bf16. 1000 pages of 64 tokens.
  PoolSpec mha =
      Spec(Attention::kMha, HostLayout::kPageFirst, 32, 8, 128, 2, 64, 64000);
  PoolSpec mla = Spec(Attention::kMla, HostLayout::kPageFirstDirect, 61, 1, 576,
                      2, 64, 64000);
  const PoolGeometry gm = reference::ToGeometry(mha);
  const PoolGeometry gl = reference::ToGeometry(mla);
  EXPECT_EQ(2u * 32 * 8 * 128 * 2, gm.bytes_per_token());
  EXPECT_EQ(ReferencePool(mha).TotalBytes(), gm.total_bytes());
  EXPECT_EQ(61u * 576 * 2, gl.bytes_per_token());
  EXPECT_EQ(ReferencePool(mla).TotalBytes(), gl.total_bytes());
  EXPECT_EQ(1000u, gl.num_pages());
}

TEST(PoolGeometryTest, OffsetsInPoolsBeyond4GiBDoNotOverflow) {
  // 80 layers, 8 heads of 128 bf16, 20000 pages of 64 tokens: ~420 GB.
  // Only offsets are computed; nothing is allocated.
  for (Attention attention : {Attention::kMha, Attention::kMla}) {
    for (HostLayout layout : reference::AllLayouts()) {
      if (!reference::LayoutDefined(attention, layout)) continue;
      const bool mha = attention == Attention::kMha;
      const PoolSpec spec = Spec(attention, layout, 80, mha ? 8 : 1,
                                 mha ? 128 : 576, 2, 64, 64 * 20000);
      SCOPED_TRACE(reference::SpecName(spec));
      const ReferencePool ref(spec);
      const PoolGeometry g = reference::ToGeometry(spec);
      ASSERT_EQ(ref.TotalBytes(), g.total_bytes());
      ASSERT_GT(g.total_bytes(), uint64_t{1} << 36);
      const uint64_t last_kv = mha ? 1 : 0;
      const uint64_t last_head = spec.heads - 1;
      for (const Coord& c : {Coord{last_kv, 79, spec.size - 1, last_head, 0},
                             Coord{last_kv, 0, spec.size - 1, 0, 0},
                             Coord{0, 79, spec.size - 65, last_head, 0},
                             Coord{last_kv, 41, 987654, last_head, 0}}) {
        const ChunkPosition p = PositionInChunk(spec, c, 0);
        EXPECT_EQ(
            ref.ByteOffset(c),
            HostChunkOffset(g, static_cast<uint32_t>(c.kv),
                            static_cast<uint32_t>(c.layer), c.token, p.chunk) +
                p.byte_in_chunk)
            << "token " << c.token << " layer " << c.layer;
      }
      // A device buffer of 5M slots is past 4 GiB too.
      const ReferenceDevice device(spec, 5000000);
      const ChunkPosition p =
          PositionInChunk(spec, Coord{0, 0, 4999999, last_head, 0}, 0);
      EXPECT_EQ(device.ByteOffset(4999999, last_head, 0),
                DeviceChunkOffset(g, 4999999, p.chunk) + p.byte_in_chunk);
    }
  }
}

}  // namespace
}  // namespace hostkv
