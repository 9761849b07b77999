// The byte geometry of one host KV pool: what a token row is, how many there
// are, and which host layout places them. Plain data, usable from CUDA code.
#ifndef HOSTKV_KERNELS_POOL_GEOMETRY_H_
#define HOSTKV_KERNELS_POOL_GEOMETRY_H_

#include <cstdint>

#include "kernels/host_device.h"

namespace hostkv {

enum class Attention : uint8_t { kMha = 0, kMla = 1 };

// SGLang's host layouts (memory_pool_host.py); see layout_offsets.h.
enum class HostLayout : uint8_t {
  kLayerFirst = 0,
  kPageFirst = 1,
  kPageFirstDirect = 2,
  kPageHead = 3,  // MHA only
};

const char* HostLayoutName(HostLayout layout);

struct PoolGeometry {
  Attention attention = Attention::kMha;
  HostLayout layout = HostLayout::kLayerFirst;
  uint32_t num_layers = 0;
  uint32_t num_heads = 0;   // MHA: kv heads; MLA: 1
  uint32_t head_bytes = 0;  // MHA: head_dim * itemsize; MLA: kv_dim * itemsize
  uint32_t page_size = 0;   // tokens per page
  uint64_t token_slots = 0;  // a multiple of page_size

  // K and V planes (MHA) or one latent plane (MLA).
  HOSTKV_HD uint32_t kv_planes() const {
    return attention == Attention::kMha ? 2 : 1;
  }
  // Bytes of one token's row in one layer and plane.
  HOSTKV_HD uint64_t token_stride() const {
    return static_cast<uint64_t>(num_heads) * head_bytes;
  }
  HOSTKV_HD uint64_t plane_bytes() const {
    return token_slots * num_layers * token_stride();
  }
  HOSTKV_HD uint64_t total_bytes() const { return kv_planes() * plane_bytes(); }
  HOSTKV_HD uint64_t bytes_per_token() const {
    return static_cast<uint64_t>(kv_planes()) * num_layers * token_stride();
  }
  HOSTKV_HD uint64_t page_bytes() const { return bytes_per_token() * page_size; }
  HOSTKV_HD uint64_t num_pages() const { return token_slots / page_size; }

  // A token row of one layer and plane is stored as chunks_per_row() pieces
  // of chunk_bytes() each: one piece, except page_head, which keeps each
  // head's D elements apart.
  HOSTKV_HD uint32_t chunks_per_row() const {
    return layout == HostLayout::kPageHead ? num_heads : 1;
  }
  HOSTKV_HD uint64_t chunk_bytes() const {
    return layout == HostLayout::kPageHead ? head_bytes : token_stride();
  }
};

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_POOL_GEOMETRY_H_
