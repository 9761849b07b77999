#include "server/pool/pool_spec.h"

#include "absl/strings/str_cat.h"
#include "proto/contract/status_macros.h"

namespace hostkv {

uint32_t DtypeSize(v1::Dtype dtype) {
  switch (dtype) {
    case v1::DTYPE_BF16:
    case v1::DTYPE_FP16:
      return 2;
    case v1::DTYPE_FP32:
      return 4;
    case v1::DTYPE_FP8_E4M3:
    case v1::DTYPE_FP8_E5M2:
      return 1;
    default:
      return 0;
  }
}

bool IsValidPoolName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

namespace {

absl::Status CheckRange(const char* field, uint64_t value, uint64_t max) {
  if (value == 0 || value > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " must be in [1, ", max, "], got ", value));
  }
  return absl::OkStatus();
}

absl::Status ResolveAttention(const v1::Geometry& geo, uint32_t item,
                              PoolGeometry* g) {
  switch (geo.attention_case()) {
    case v1::Geometry::kMha: {
      const v1::MhaGeometry& m = geo.mha();
      RETURN_IF_ERROR(
          CheckRange("geometry.mha.num_layers", m.num_layers(), kMaxLayers));
      RETURN_IF_ERROR(
          CheckRange("geometry.mha.num_kv_heads", m.num_kv_heads(), kMaxHeads));
      RETURN_IF_ERROR(
          CheckRange("geometry.mha.head_dim", m.head_dim(), kMaxHeadDim));
      g->attention = Attention::kMha;
      g->num_layers = m.num_layers();
      g->num_heads = m.num_kv_heads();
      g->head_bytes = m.head_dim() * item;
      return absl::OkStatus();
    }
    case v1::Geometry::kMla: {
      const v1::MlaGeometry& m = geo.mla();
      RETURN_IF_ERROR(
          CheckRange("geometry.mla.num_layers", m.num_layers(), kMaxLayers));
      // The row width: kv_cache_dim when set (SGLang's
      // override_kv_cache_dim), else the latent and rope parts.
      uint64_t kv_dim = m.kv_cache_dim();
      if (kv_dim != 0) {
        RETURN_IF_ERROR(
            CheckRange("geometry.mla.kv_cache_dim", kv_dim, kMaxHeadDim));
      } else {
        kv_dim = uint64_t{m.kv_lora_rank()} + m.qk_rope_head_dim();
        RETURN_IF_ERROR(CheckRange(
            "geometry.mla.kv_lora_rank + qk_rope_head_dim (kv_cache_dim unset)",
            kv_dim, kMaxHeadDim));
      }
      g->attention = Attention::kMla;
      g->num_layers = m.num_layers();
      g->num_heads = 1;
      g->head_bytes = static_cast<uint32_t>(kv_dim * item);
      return absl::OkStatus();
    }
    case v1::Geometry::kBlocks: {
      // vLLM's raw blocks: one plane of rows of block_bytes bytes per
      // tensor, the MLA math with kv_dim bytes (item is 1, checked by the
      // caller).
      const v1::BlocksGeometry& b = geo.blocks();
      RETURN_IF_ERROR(CheckRange("geometry.blocks.num_tensors", b.num_tensors(),
                                 kMaxLayers));
      RETURN_IF_ERROR(CheckRange("geometry.blocks.block_bytes", b.block_bytes(),
                                 kMaxBlockBytes));
      g->attention = Attention::kMla;
      g->num_layers = b.num_tensors();
      g->num_heads = 1;
      g->head_bytes = b.block_bytes() * item;
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError("geometry: set mha, mla or blocks");
  }
}

absl::Status ResolveLayout(v1::Layout layout, PoolGeometry* g) {
  switch (layout) {
    case v1::LAYOUT_LAYER_FIRST:
      g->layout = HostLayout::kLayerFirst;
      return absl::OkStatus();
    case v1::LAYOUT_PAGE_FIRST:
      g->layout = HostLayout::kPageFirst;
      return absl::OkStatus();
    case v1::LAYOUT_PAGE_FIRST_DIRECT:
      g->layout = HostLayout::kPageFirstDirect;
      return absl::OkStatus();
    case v1::LAYOUT_PAGE_HEAD:
      if (g->attention != Attention::kMha) {
        return absl::InvalidArgumentError("layout page_head is MHA only");
      }
      g->layout = HostLayout::kPageHead;
      return absl::OkStatus();
    case v1::LAYOUT_PAGE_FIRST_KV_SPLIT:
      return absl::UnimplementedError(
          "layout page_first_kv_split (SGLang's Ascend-only MLA layout) is not "
          "implemented");
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "layout: unknown or unspecified value ", layout,
          "; one of LAYOUT_LAYER_FIRST, LAYOUT_PAGE_FIRST, "
          "LAYOUT_PAGE_FIRST_DIRECT, LAYOUT_PAGE_HEAD (MHA only)"));
  }
}

absl::StatusOr<uint64_t> ResolveTokens(const v1::PoolSpec& spec,
                                       uint64_t bytes_per_token) {
  switch (spec.capacity_case()) {
    case v1::PoolSpec::kCapacityTokens:
      if (spec.capacity_tokens() == 0) {
        return absl::InvalidArgumentError("capacity_tokens must be positive");
      }
      return spec.capacity_tokens();
    case v1::PoolSpec::kCapacityBytes:
      if (spec.capacity_bytes() < bytes_per_token) {
        return absl::InvalidArgumentError(absl::StrCat(
            "capacity_bytes ", spec.capacity_bytes(),
            " holds no token: one token needs ", bytes_per_token, " bytes"));
      }
      return spec.capacity_bytes() / bytes_per_token;
    default:
      return absl::InvalidArgumentError(
          "capacity: set capacity_bytes or capacity_tokens");
  }
}

}  // namespace

absl::StatusOr<PoolGeometry> ResolvePoolSpec(const v1::PoolSpec& spec) {
  if (!IsValidPoolName(spec.name())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name '", spec.name(), "' must be 1..64 of [A-Za-z0-9_.-]"));
  }
  // A blocks pool holds bytes: its dtype is left unspecified.
  const bool blocks = spec.geometry().has_blocks();
  if (blocks && spec.geometry().dtype() != v1::DTYPE_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "geometry.dtype: a blocks geometry holds bytes; leave dtype unset, got ",
        spec.geometry().dtype()));
  }
  const uint32_t item = blocks ? 1 : DtypeSize(spec.geometry().dtype());
  if (item == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry.dtype: unknown or unspecified value ",
                     spec.geometry().dtype()));
  }
  PoolGeometry g;
  RETURN_IF_ERROR(ResolveAttention(spec.geometry(), item, &g));
  RETURN_IF_ERROR(ResolveLayout(spec.layout(), &g));
  RETURN_IF_ERROR(CheckRange("page_size", spec.page_size(), kMaxPageSize));
  g.page_size = spec.page_size();
  if (!v1::CopyMechanism_IsValid(spec.default_mechanism())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "default_mechanism: unknown value ", spec.default_mechanism()));
  }
  const uint64_t bytes_per_token = g.bytes_per_token();  // <= 2^45
  ASSIGN_OR_RETURN(const uint64_t tokens, ResolveTokens(spec, bytes_per_token));
  const uint64_t max_tokens = kMaxPoolBytes / bytes_per_token;
  if (tokens >= max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity of ", tokens, " tokens exceeds the 1 PiB pool limit"));
  }
  // SGLang: page_num = size // page_size + 1; size = page_num * page_size.
  g.token_slots = (tokens / g.page_size + 1) * g.page_size;
  if (g.total_bytes() > kMaxPoolBytes) {
    return absl::InvalidArgumentError("capacity exceeds the 1 PiB pool limit");
  }
  if (spec.device_pool_tokens() != 0 &&
      g.token_slots <= spec.device_pool_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the host pool (", g.token_slots,
        " token slots) must be larger than the device pool (",
        spec.device_pool_tokens(), " tokens)"));
  }
  return g;
}

v1::PoolSpec NormalizePoolSpec(const v1::PoolSpec& spec) {
  v1::PoolSpec out = spec;
  if (out.default_mechanism() == v1::MECHANISM_UNSPECIFIED) {
    out.set_default_mechanism(v1::MECHANISM_DIRECT);
  }
  return out;
}

absl::StatusOr<CopyMechanism> ResolveMechanism(v1::CopyMechanism mechanism,
                                               v1::CopyMechanism fallback) {
  if (mechanism == v1::MECHANISM_UNSPECIFIED) mechanism = fallback;
  switch (mechanism) {
    case v1::MECHANISM_KERNEL:
      return CopyMechanism::kKernel;
    case v1::MECHANISM_DIRECT:
    case v1::MECHANISM_UNSPECIFIED:
      return CopyMechanism::kDirect;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("mechanism: unknown value ", mechanism));
  }
}

}  // namespace hostkv
