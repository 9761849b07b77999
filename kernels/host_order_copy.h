// Backups on the CPU backend, walked in the host pool's address order.
//
// A per-layer walk (CopyLayerSlice) writes a page_head host page as 256-byte
// head rows `num_layers * head_bytes` apart, and a page_first one as token
// rows `num_layers * row` apart: every piece lands on another 4 KiB page and
// the stores go out as scattered partial-page writes. For a copy into the
// host pool of several layers at once (a backup) the host side can be
// written front to back instead, each host page in one pass over all the
// layers, reading the layers' device rows as they come (the device side is
// [token, head, dim] per layer, so those reads stay within a few rows of
// each layer buffer).
#ifndef HOSTKV_KERNELS_HOST_ORDER_COPY_H_
#define HOSTKV_KERNELS_HOST_ORDER_COPY_H_

#include <cstdint>

#include "kernels/copy_plan.h"

namespace hostkv {

// Whether a backup of `g`'s layout gains from the host order: page_head and
// page_first, whose per-layer pieces (head rows, token rows) lie
// num_layers apart on the host. layer_first and page_first_direct keep a
// layer's rows of a page together, so a per-layer walk already writes
// page-sized pieces (and measured no slower).
bool HostOrderHelps(const PoolGeometry& g);

// Copies tokens [token_begin, token_end) (positions in the concatenated
// runs) of layers [layer_begin, layer_end), every plane, from the device
// buffers to the host pool, host page by host page, each page's bytes in
// ascending host address order. Same bytes as CopyLayerSlice for each of
// those layers.
// REQUIRES: task.direction == kDeviceToHost; task.IndexRuns() was called;
//           token_end <= total_tokens; layer_end <= num_layers.
void CopyHostOrderSlice(const CopyTask& task, uint32_t layer_begin,
                        uint32_t layer_end, uint64_t token_begin,
                        uint64_t token_end);

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_HOST_ORDER_COPY_H_
