#include "kernels/page_format.h"

#include <cstring>

#include "kernels/layout_offsets.h"

namespace hostkv {
namespace {

// Merges adjacent (pool offset, flat offset) chunks into one memcpy.
class ChunkCoalescer {
 public:
  template <typename CopyFn>
  void Add(uint64_t pool_offset, uint64_t flat_offset, uint64_t bytes,
           CopyFn&& copy) {
    if (bytes_ != 0 && pool_ + bytes_ == pool_offset &&
        flat_ + bytes_ == flat_offset) {
      bytes_ += bytes;
      return;
    }
    Flush(copy);
    pool_ = pool_offset;
    flat_ = flat_offset;
    bytes_ = bytes;
  }
  template <typename CopyFn>
  void Flush(CopyFn&& copy) {
    if (bytes_ != 0) copy(pool_, flat_, bytes_);
    bytes_ = 0;
  }

 private:
  uint64_t pool_ = 0;
  uint64_t flat_ = 0;
  uint64_t bytes_ = 0;
};

// Calls copy(pool_offset, flat_offset, bytes) for every contiguous piece of
// `page`, walking the chunks in the layout's flat order.
template <typename CopyFn>
void ForEachFlatPiece(const PoolGeometry& g, uint64_t page, CopyFn&& copy) {
  const uint64_t first = page * g.page_size;
  const uint64_t chunk = g.chunk_bytes();
  ChunkCoalescer coalescer;
  uint64_t flat = 0;
  auto emit = [&](uint32_t kv, uint32_t layer, uint32_t t, uint32_t c) {
    coalescer.Add(HostChunkOffset(g, kv, layer, first + t, c), flat, chunk,
                  copy);
    flat += chunk;
  };
  for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
    switch (g.layout) {
      case HostLayout::kLayerFirst:
      case HostLayout::kPageFirstDirect:  // (L, ps) order
        for (uint32_t l = 0; l < g.num_layers; ++l)
          for (uint32_t t = 0; t < g.page_size; ++t) emit(kv, l, t, 0);
        break;
      case HostLayout::kPageFirst:  // (ps, L) order
        for (uint32_t t = 0; t < g.page_size; ++t)
          for (uint32_t l = 0; l < g.num_layers; ++l) emit(kv, l, t, 0);
        break;
      case HostLayout::kPageHead:  // (H, ps, L) order
        for (uint32_t h = 0; h < g.num_heads; ++h)
          for (uint32_t t = 0; t < g.page_size; ++t)
            for (uint32_t l = 0; l < g.num_layers; ++l) emit(kv, l, t, h);
        break;
    }
  }
  coalescer.Flush(copy);
}

}  // namespace

void CopyPageToFlat(const PoolGeometry& g, const uint8_t* pool, uint64_t page,
                    uint8_t* flat) {
  ForEachFlatPiece(g, page, [&](uint64_t pool_off, uint64_t flat_off,
                                uint64_t n) {
    std::memcpy(flat + flat_off, pool + pool_off, n);
  });
}

void CopyFlatToPage(const PoolGeometry& g, const uint8_t* flat, uint64_t page,
                    uint8_t* pool) {
  ForEachFlatPiece(g, page, [&](uint64_t pool_off, uint64_t flat_off,
                                uint64_t n) {
    std::memcpy(pool + pool_off, flat + flat_off, n);
  });
}

void AppendPageFlatPieces(const PoolGeometry& g, uint64_t page,
                          std::vector<BufferPiece>* pieces) {
  ForEachFlatPiece(g, page, [&](uint64_t pool_off, uint64_t, uint64_t n) {
    pieces->push_back({pool_off, n});
  });
}

void AppendPageBufferPieces(const PoolGeometry& g, uint64_t page,
                            std::vector<BufferPiece>* pieces) {
  const uint64_t first = page * g.page_size;
  if (g.layout == HostLayout::kLayerFirst) {
    const uint64_t size = g.page_size * g.token_stride();
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
        pieces->push_back({HostChunkOffset(g, kv, l, first, 0), size});
      }
    }
    return;
  }
  // Every other layout keeps a page's plane contiguous; it starts where the
  // page's first token of layer 0 (chunk 0) starts.
  const uint64_t size = g.page_bytes() / g.kv_planes();
  for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
    pieces->push_back({HostChunkOffset(g, kv, 0, first, 0), size});
  }
}

void AppendPageRunPieces(const PoolGeometry& g, uint64_t first_page,
                         uint64_t num_pages, std::vector<BufferPiece>* pieces) {
  if (num_pages == 0) return;
  std::vector<BufferPiece> first;
  std::vector<BufferPiece> last;
  AppendPageBufferPieces(g, first_page, &first);
  AppendPageBufferPieces(g, first_page + num_pages - 1, &last);
  bool contiguous = first.size() == last.size();
  for (size_t i = 0; contiguous && i < first.size(); ++i) {
    contiguous = last[i].size == first[i].size &&
                 last[i].offset == first[i].offset + (num_pages - 1) * first[i].size;
  }
  if (contiguous) {
    for (const BufferPiece& piece : first) {
      pieces->push_back({piece.offset, piece.size * num_pages});
    }
    return;
  }
  for (uint64_t page = first_page; page < first_page + num_pages; ++page) {
    AppendPageBufferPieces(g, page, pieces);
  }
}

void CopyPage(const PoolGeometry& g, uint8_t* pool, uint64_t from,
              uint64_t to) {
  std::vector<BufferPiece> source;
  std::vector<BufferPiece> target;
  AppendPageBufferPieces(g, from, &source);
  AppendPageBufferPieces(g, to, &target);
  for (size_t i = 0; i < source.size(); ++i) {
    std::memcpy(pool + target[i].offset, pool + source[i].offset,
                source[i].size);
  }
}

}  // namespace hostkv
