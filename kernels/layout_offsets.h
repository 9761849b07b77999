// Byte offsets of KV data inside a host pool and a device buffer: the one
// definition of every layout, shared by the CPU copy path and the CUDA
// kernels. Shapes (first MHA axis K=0 / V=1; S token slots, P pages):
//   layer_first        MHA (2, L, S, H, D)        MLA (L, S, 1, kv_dim)
//   page_first         MHA (2, S, L, H, D)        MLA (S, L, 1, kv_dim)
//   page_first_direct  MHA (2, P, L, ps, H, D)    MLA (P, L, ps, 1, kv_dim)
//   page_head          MHA (2, P, H, ps, L, D)
#ifndef HOSTKV_KERNELS_LAYOUT_OFFSETS_H_
#define HOSTKV_KERNELS_LAYOUT_OFFSETS_H_

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/pool_geometry.h"

namespace hostkv {

// Offset in the pool of chunk `chunk` of token `token`'s row in `layer` of
// plane `kv` (0 = K or the MLA latent, 1 = V).
// REQUIRES: kv < kv_planes(), layer < num_layers, token < token_slots,
//           chunk < chunks_per_row().
HOSTKV_HD uint64_t HostChunkOffset(const PoolGeometry& g, uint32_t kv,
                                   uint32_t layer, uint64_t token,
                                   uint32_t chunk) {
  const uint64_t stride = g.token_stride();
  const uint64_t plane = kv * g.plane_bytes();
  const uint64_t layers = g.num_layers;
  const uint64_t page = token / g.page_size;
  const uint64_t in_page = token % g.page_size;
  switch (g.layout) {
    case HostLayout::kLayerFirst:
      return plane + (layer * g.token_slots + token) * stride;
    case HostLayout::kPageFirst:
      return plane + (token * layers + layer) * stride;
    case HostLayout::kPageFirstDirect:
      return plane + ((page * layers + layer) * g.page_size + in_page) * stride;
    case HostLayout::kPageHead:
      return plane +
             (((page * g.num_heads + chunk) * g.page_size + in_page) * layers +
              layer) *
                 g.head_bytes;
  }
  return 0;
}

// Offset of chunk `chunk` of device row `token` inside one layer's device
// buffer ([token_slots, H, D], row-major).
HOSTKV_HD uint64_t DeviceChunkOffset(const PoolGeometry& g, uint64_t token,
                                     uint32_t chunk) {
  return token * g.token_stride() + chunk * g.chunk_bytes();
}

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_LAYOUT_OFFSETS_H_
