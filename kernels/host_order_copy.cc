#include "kernels/host_order_copy.h"

#include <algorithm>
#include <cstring>

#include "kernels/layout_offsets.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace hostkv {
namespace {

// Copies `bytes` to the host pool with non-temporal stores where it can
// (16-byte aligned destination, whole 64-byte blocks): the host side is
// written front to back and not read again soon, so its lines need not be
// read in first (a plain store reads each line before writing it, a third
// more memory traffic than the copy itself). REQUIRES: a StoreFence() after
// the last call, before the copy is reported done.
inline void StreamCopy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
#if defined(__SSE2__)
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0 && (bytes & 63) == 0) {
    auto* d = reinterpret_cast<__m128i*>(dst);
    const auto* s = reinterpret_cast<const __m128i*>(src);
    for (uint64_t n = bytes / 64; n != 0; --n, d += 4, s += 4) {
      const __m128i a = _mm_loadu_si128(s);
      const __m128i b = _mm_loadu_si128(s + 1);
      const __m128i c = _mm_loadu_si128(s + 2);
      const __m128i e = _mm_loadu_si128(s + 3);
      _mm_stream_si128(d, a);
      _mm_stream_si128(d + 1, b);
      _mm_stream_si128(d + 2, c);
      _mm_stream_si128(d + 3, e);
    }
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

// Asks for the source lines of the next token's piece of the same layer:
// the 32-odd layer buffers a host page gathers from are more streams than
// the hardware prefetcher follows (and, at equal offsets in equally sized
// buffers, they share cache sets).
inline void Prefetch(const uint8_t* p, uint64_t bytes) {
  for (uint64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off);
}

inline void StoreFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// At most this many tokens per group: a page_head group reads
// kGroupTokens rows of every layer once per head, which stays within the
// TLB's reach (16 tokens x 32 layers of 2 KiB rows: 256 4 KiB pages) where
// a page of 64 tokens would not.
constexpr uint64_t kGroupTokens = 16;

// Tokens [host_token, host_token + count) of one host page and the device
// rows [device_token, ...) they pair with.
struct PageGroup {
  uint64_t host_token;
  uint64_t device_token;
  uint64_t count;
};

// Copies one group's bytes of plane `kv`, layers [lb, le), host address
// ascending.
void CopyGroup(const CopyTask& task, uint32_t kv, uint32_t lb, uint32_t le,
               const PageGroup& grp) {
  const PoolGeometry& g = task.geometry;
  const uint64_t stride = g.token_stride();
  uint8_t* const host = task.host_base;
  switch (g.layout) {
    case HostLayout::kLayerFirst:
    case HostLayout::kPageFirstDirect:
      // Layer by layer, the group's rows are contiguous on both sides.
      for (uint32_t l = lb; l < le; ++l) {
        StreamCopy(host + HostChunkOffset(g, kv, l, grp.host_token, 0),
                   task.layers[l].plane[kv] + grp.device_token * stride,
                   grp.count * stride);
      }
      return;
    case HostLayout::kPageFirst:
      // Token by token, the layers' rows follow each other on the host.
      for (uint64_t i = 0; i < grp.count; ++i) {
        uint8_t* dst = host + HostChunkOffset(g, kv, lb, grp.host_token + i, 0);
        const uint64_t src = (grp.device_token + i) * stride;
        const bool more = i + 1 < grp.count;
        for (uint32_t l = lb; l < le; ++l, dst += stride) {
          const uint8_t* from = task.layers[l].plane[kv] + src;
          if (more) Prefetch(from + stride, stride);
          StreamCopy(dst, from, stride);
        }
      }
      return;
    case HostLayout::kPageHead: {
      // Head by head, token by token, the layers' head rows follow each
      // other on the host.
      const uint64_t head = g.head_bytes;
      for (uint32_t c = 0; c < g.num_heads; ++c) {
        for (uint64_t i = 0; i < grp.count; ++i) {
          uint8_t* dst =
              host + HostChunkOffset(g, kv, lb, grp.host_token + i, c);
          const uint64_t src = (grp.device_token + i) * stride + c * head;
          const bool more = i + 1 < grp.count;
          for (uint32_t l = lb; l < le; ++l, dst += head) {
            const uint8_t* from = task.layers[l].plane[kv] + src;
            if (more) Prefetch(from + stride, head);
            StreamCopy(dst, from, head);
          }
        }
      }
      return;
    }
  }
}

}  // namespace

bool HostOrderHelps(const PoolGeometry& g) {
  return g.layout == HostLayout::kPageHead ||
         g.layout == HostLayout::kPageFirst;
}

void CopyHostOrderSlice(const CopyTask& task, uint32_t layer_begin,
                        uint32_t layer_end, uint64_t token_begin,
                        uint64_t token_end) {
  if (token_begin >= token_end || layer_begin >= layer_end) return;
  const uint64_t page_size = task.geometry.page_size;
  for (size_t r = RunAt(task, token_begin); r < task.runs.size(); ++r) {
    const uint64_t run_start = task.run_starts[r];
    if (run_start >= token_end) break;
    const TokenRun& run = task.runs[r];
    const uint64_t begin = std::max(token_begin, run_start) - run_start;
    const uint64_t end =
        std::min(token_end, run_start + run.num_tokens) - run_start;
    for (uint64_t i = begin; i < end;) {
      const uint64_t host_token = run.host_token + i;
      const uint64_t page_end = (host_token / page_size + 1) * page_size;
      const uint64_t n =
          std::min({end - i, page_end - host_token, kGroupTokens});
      const PageGroup grp{host_token, run.device_token + i, n};
      for (uint32_t kv = 0; kv < task.geometry.kv_planes(); ++kv) {
        CopyGroup(task, kv, layer_begin, layer_end, grp);
      }
      i += n;
    }
  }
  StoreFence();
}

}  // namespace hostkv
