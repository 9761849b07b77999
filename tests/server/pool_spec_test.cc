#include "server/pool/pool_spec.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

v1::PoolSpec MhaSpec(uint32_t layers, uint32_t heads, uint32_t dim,
                     uint32_t page_size, v1::Layout layout) {
  v1::PoolSpec spec;
  spec.set_name("llama");
  spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  auto* mha = spec.mutable_geometry()->mutable_mha();
  mha->set_num_layers(layers);
  mha->set_num_kv_heads(heads);
  mha->set_head_dim(dim);
  spec.set_page_size(page_size);
  spec.set_layout(layout);
  spec.set_capacity_tokens(1000);
  return spec;
}

TEST(PoolSpecTest, SizesLikeSglangFromTokens) {
  // page_num = 1000 // 16 + 1 = 63 -> 1008 slots.
  auto g = ResolvePoolSpec(MhaSpec(32, 8, 128, 16, v1::LAYOUT_PAGE_FIRST));
  ASSERT_OK(g);
  EXPECT_EQ(1008u, g->token_slots);
  EXPECT_EQ(63u, g->num_pages());
  EXPECT_EQ(2u * 32 * 8 * 128 * 2, g->bytes_per_token());
  EXPECT_EQ(1008u * 2 * 32 * 8 * 128 * 2, g->total_bytes());
}

TEST(PoolSpecTest, AlwaysAddsOnePageEvenWhenAligned) {
  v1::PoolSpec spec = MhaSpec(2, 1, 8, 16, v1::LAYOUT_LAYER_FIRST);
  spec.set_capacity_tokens(64);
  auto g = ResolvePoolSpec(spec);
  ASSERT_OK(g);
  EXPECT_EQ(80u, g->token_slots);  // (64 // 16 + 1) * 16
}

TEST(PoolSpecTest, SizesLikeSglangFromBytes) {
  v1::PoolSpec spec = MhaSpec(2, 2, 4, 4, v1::LAYOUT_PAGE_HEAD);
  const uint64_t bytes_per_token = 2 * 2 * 2 * 4 * 2;  // 64
  spec.set_capacity_bytes(bytes_per_token * 10 + 63);  // floor -> 10 tokens
  auto g = ResolvePoolSpec(spec);
  ASSERT_OK(g);
  EXPECT_EQ(12u, g->token_slots);  // (10 // 4 + 1) * 4
}

TEST(PoolSpecTest, MlaGeometry) {
  v1::PoolSpec spec;
  spec.set_name("ds");
  spec.mutable_geometry()->set_dtype(v1::DTYPE_FP8_E4M3);
  auto* mla = spec.mutable_geometry()->mutable_mla();
  mla->set_num_layers(61);
  mla->set_kv_lora_rank(512);
  mla->set_qk_rope_head_dim(64);
  spec.set_page_size(64);
  spec.set_layout(v1::LAYOUT_PAGE_FIRST_DIRECT);
  spec.set_capacity_tokens(100);
  auto g = ResolvePoolSpec(spec);
  ASSERT_OK(g);
  EXPECT_EQ(Attention::kMla, g->attention);
  EXPECT_EQ(576u, g->token_stride());
  EXPECT_EQ(61u * 576, g->bytes_per_token());
  EXPECT_EQ(128u, g->token_slots);
}

v1::PoolSpec BlocksSpec(uint32_t tensors, uint32_t block_bytes) {
  v1::PoolSpec spec;
  spec.set_name("vllm");
  auto* b = spec.mutable_geometry()->mutable_blocks();
  b->set_num_tensors(tensors);
  b->set_block_bytes(block_bytes);
  spec.set_page_size(1);
  spec.set_layout(v1::LAYOUT_PAGE_FIRST);
  spec.set_capacity_tokens(100);
  return spec;
}

TEST(PoolSpecTest, BlocksAreOnePlaneOfByteRowsPerTensor) {
  // vLLM, Llama-3-8B on one GPU, FlashAttention: 64 tensors (K and V of 32
  // layers) of 16 tokens x 8 heads x 128 x 2 bytes = 32 KiB blocks.
  auto g = ResolvePoolSpec(BlocksSpec(64, 32768));
  ASSERT_OK(g);
  EXPECT_EQ(Attention::kMla, g->attention);  // the same offset rules
  EXPECT_EQ(1u, g->kv_planes());
  EXPECT_EQ(64u, g->num_layers);
  EXPECT_EQ(32768u, g->token_stride());
  EXPECT_EQ(64u * 32768, g->bytes_per_token());
  EXPECT_EQ(101u, g->token_slots);
  // Rows above MLA's 65,536-element bound are fine (block_size 128).
  EXPECT_OK(ResolvePoolSpec(BlocksSpec(2, 4u << 20)));
}

TEST(PoolSpecTest, BlocksRefuseBadSizesAndADtype) {
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(BlocksSpec(0, 4096)));
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(BlocksSpec(4097, 4096)));
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(BlocksSpec(2, 0)));
  EXPECT_ERROR(InvalidArgument,
               ResolvePoolSpec(BlocksSpec(2, kMaxBlockBytes + 1)));
  v1::PoolSpec typed = BlocksSpec(2, 4096);
  typed.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  absl::StatusOr<PoolGeometry> g = ResolvePoolSpec(typed);
  EXPECT_ERROR(InvalidArgument, g);
  EXPECT_NE(std::string::npos, g.status().message().find("leave dtype unset"));
}

v1::PoolSpec DsaSpec(uint32_t kv_cache_dim) {
  v1::PoolSpec spec;
  spec.set_name("dsa");
  spec.mutable_geometry()->set_dtype(v1::DTYPE_FP8_E4M3);
  auto* mla = spec.mutable_geometry()->mutable_mla();
  mla->set_num_layers(61);
  mla->set_kv_lora_rank(512);
  mla->set_qk_rope_head_dim(64);
  mla->set_kv_cache_dim(kv_cache_dim);
  spec.set_page_size(64);
  spec.set_layout(v1::LAYOUT_PAGE_FIRST);
  spec.set_capacity_tokens(100);
  return spec;
}

TEST(PoolSpecTest, MlaKvCacheDimSetsTheRowWidth) {
  // SGLang's NSA fp8 row: 512 latent + 16 scale + 128 rope bytes.
  auto g = ResolvePoolSpec(DsaSpec(656));
  ASSERT_OK(g);
  EXPECT_EQ(Attention::kMla, g->attention);
  EXPECT_EQ(656u, g->head_bytes);
  EXPECT_EQ(656u, g->token_stride());
  EXPECT_EQ(61u * 656, g->bytes_per_token());
  EXPECT_EQ(128u * 61 * 656, g->total_bytes());
  // In elements of the dtype: bf16 doubles the bytes.
  v1::PoolSpec bf16 = DsaSpec(656);
  bf16.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  auto wide = ResolvePoolSpec(bf16);
  ASSERT_OK(wide);
  EXPECT_EQ(61u * 656 * 2, wide->bytes_per_token());
  // 0 keeps kv_lora_rank + qk_rope_head_dim.
  auto plain = ResolvePoolSpec(DsaSpec(0));
  ASSERT_OK(plain);
  EXPECT_EQ(61u * 576, plain->bytes_per_token());
}

TEST(PoolSpecTest, MlaKvCacheDimOutOfRangeIsRefusedByName) {
  auto g = ResolvePoolSpec(DsaSpec(kMaxHeadDim + 1));
  EXPECT_ERROR(InvalidArgument, g);
  EXPECT_NE(std::string::npos,
            g.status().message().find("geometry.mla.kv_cache_dim"))
      << g.status();
  EXPECT_OK(ResolvePoolSpec(DsaSpec(kMaxHeadDim)));
  // Without kv_cache_dim the sum is bounded as before.
  v1::PoolSpec sum = DsaSpec(0);
  sum.mutable_geometry()->mutable_mla()->set_kv_lora_rank(kMaxHeadDim);
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(sum));
  // kv_cache_dim stands in for the sum.
  sum.mutable_geometry()->mutable_mla()->set_kv_cache_dim(656);
  EXPECT_OK(ResolvePoolSpec(sum));
}

TEST(PoolSpecTest, RefusesBadFields) {
  auto spec = [] { return MhaSpec(4, 2, 8, 16, v1::LAYOUT_PAGE_FIRST); };
  v1::PoolSpec s = spec();
  s.set_name("bad/name");
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(s));
  s = spec();
  s.set_name("");
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(s));
  s = spec();
  s.mutable_geometry()->clear_mha();
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(s));
  s = spec();
  s.mutable_geometry()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(s));
  s = spec();
  s.mutable_geometry()->set_dtype(static_cast<v1::Dtype>(99));
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(s));
  s = spec();
  s.set_page_size(0);
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(s));
  s = spec();
  s.set_layout(v1::LAYOUT_UNSPECIFIED);
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(s));
  s = spec();
  s.set_layout(static_cast<v1::Layout>(42));
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(s));
  s = spec();
  s.set_layout(v1::LAYOUT_PAGE_FIRST_KV_SPLIT);
  EXPECT_ERROR(Unimplemented, ResolvePoolSpec(s));
  s = spec();
  s.clear_capacity_tokens();
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(s));
  s = spec();
  s.set_capacity_bytes(10);  // less than one token
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(s));
  s = spec();
  s.mutable_geometry()->mutable_mha()->set_num_layers(0);
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(s));
  s = spec();
  s.mutable_geometry()->mutable_mha()->set_num_kv_heads(1u << 20);
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(s));
  s = spec();
  s.set_default_mechanism(static_cast<v1::CopyMechanism>(7));
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(s));
}

TEST(PoolSpecTest, PageHeadIsMhaOnly) {
  v1::PoolSpec spec;
  spec.set_name("m");
  spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  spec.mutable_geometry()->mutable_mla()->set_num_layers(2);
  spec.mutable_geometry()->mutable_mla()->set_kv_lora_rank(8);
  spec.set_page_size(1);
  spec.set_layout(v1::LAYOUT_PAGE_HEAD);
  spec.set_capacity_tokens(10);
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(spec));
}

TEST(PoolSpecTest, AbsurdCapacityIsRefusedWithoutOverflow) {
  v1::PoolSpec spec = MhaSpec(4096, 1024, 65536, 1, v1::LAYOUT_LAYER_FIRST);
  spec.set_capacity_tokens(UINT64_MAX);
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(spec));
  spec.set_capacity_bytes(UINT64_MAX);
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(spec));
}

TEST(PoolSpecTest, HostPoolMustBeLargerThanDevicePool) {
  v1::PoolSpec spec = MhaSpec(2, 1, 8, 16, v1::LAYOUT_PAGE_FIRST);
  spec.set_capacity_tokens(100);  // 112 slots
  spec.set_device_pool_tokens(112);
  EXPECT_ERROR(InvalidArgument, ResolvePoolSpec(spec));
  spec.set_device_pool_tokens(111);
  EXPECT_OK(ResolvePoolSpec(spec));
}

TEST(PoolSpecTest, MechanismDefaults) {
  EXPECT_EQ(CopyMechanism::kDirect,
            *ResolveMechanism(v1::MECHANISM_UNSPECIFIED, v1::MECHANISM_DIRECT));
  EXPECT_EQ(CopyMechanism::kKernel,
            *ResolveMechanism(v1::MECHANISM_UNSPECIFIED, v1::MECHANISM_KERNEL));
  EXPECT_EQ(CopyMechanism::kKernel,
            *ResolveMechanism(v1::MECHANISM_KERNEL, v1::MECHANISM_DIRECT));
  EXPECT_ERROR(InvalidArgument,
               ResolveMechanism(static_cast<v1::CopyMechanism>(9),
                                v1::MECHANISM_DIRECT));
  EXPECT_EQ(v1::MECHANISM_DIRECT,
            NormalizePoolSpec(v1::PoolSpec()).default_mechanism());
}

}  // namespace
}  // namespace hostkv
