// An independent model of SGLang's host KV pool (memory_pool_host.py), for
// checking the production layout math in kernels/. Nothing here uses
// kernels/layout_offsets.h or kernels/page_format.h: every layout is written
// down as the tensor shape SGLang allocates (a list of named axes, exactly as
// in shared/REFERENCE.md), and offsets come from generic row-major index
// arithmetic over that shape. Only the enums of kernels/pool_geometry.h are
// shared, as labels.
#ifndef HOSTKV_TESTS_KERNELS_REFERENCE_LAYOUT_H_
#define HOSTKV_TESTS_KERNELS_REFERENCE_LAYOUT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/pool_geometry.h"

namespace hostkv {
namespace reference {

// ---------------------------------------------------------------------------
// A dense row-major tensor of the given shape: index tuples <-> element
// offsets.
class RowMajorTensor {
 public:
  explicit RowMajorTensor(std::vector<uint64_t> shape)
      : shape_(std::move(shape)) {}

  const std::vector<uint64_t>& shape() const { return shape_; }
  size_t rank() const { return shape_.size(); }

  uint64_t NumElements() const {
    uint64_t n = 1;
    for (uint64_t extent : shape_) n *= extent;
    return n;
  }

  // Element offset of `index`: sum over axes of index[i] * prod(shape[i+1:]).
  uint64_t ElementOffset(const uint64_t* index, size_t rank) const {
    if (rank != shape_.size()) {
      throw std::invalid_argument("index rank does not match the shape");
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < rank; ++i) {
      if (index[i] >= shape_[i]) {
        throw std::out_of_range("index " + std::to_string(index[i]) +
                                " out of range on axis " + std::to_string(i));
      }
      offset = offset * shape_[i] + index[i];
    }
    return offset;
  }
  uint64_t ElementOffset(const std::vector<uint64_t>& index) const {
    return ElementOffset(index.data(), index.size());
  }

  // Calls fn(index) for every index tuple, in row-major order.
  template <typename Fn>
  void ForEachIndex(Fn&& fn) const {
    if (NumElements() == 0) return;
    std::vector<uint64_t> index(shape_.size(), 0);
    while (true) {
      fn(static_cast<const std::vector<uint64_t>&>(index));
      size_t axis = shape_.size();
      while (axis > 0) {
        --axis;
        if (++index[axis] < shape_[axis]) break;
        index[axis] = 0;
        if (axis == 0) return;
      }
      if (shape_.empty()) return;
    }
  }

  // The element offsets of the slice t[..., start:start+length, ...] on
  // `axis` (every other axis whole), listed in the row-major order of the
  // sliced tensor, i.e. the order of slice.flatten().
  std::vector<uint64_t> SliceElementOffsets(size_t axis, uint64_t start,
                                            uint64_t length) const {
    if (axis >= shape_.size() || start + length > shape_[axis]) {
      throw std::out_of_range("slice out of range");
    }
    std::vector<uint64_t> slice_shape = shape_;
    slice_shape[axis] = length;
    std::vector<uint64_t> offsets;
    RowMajorTensor(slice_shape)
        .ForEachIndex([&](const std::vector<uint64_t>& slice_index) {
          std::vector<uint64_t> index = slice_index;
          index[axis] += start;
          offsets.push_back(ElementOffset(index));
        });
    return offsets;
  }

 private:
  std::vector<uint64_t> shape_;
};

// ---------------------------------------------------------------------------
// SGLang's host pool tensors.

// What an axis of a pool tensor counts.
enum class Axis {
  kKv,      // 2: K = 0, V = 1 (MHA only)
  kLayer,   // L
  kToken,   // size: token slot
  kPage,    // P = size / ps: token / ps
  kInPage,  // ps: token % ps
  kHead,    // H (MHA), the literal 1 (MLA)
  kDim,     // D = head_dim (MHA), kv_dim (MLA)
};

// A pool as SGLang sizes it. `dim` is head_dim (MHA) or kv_dim (MLA);
// MLA pools have heads == 1.
struct PoolSpec {
  Attention attention = Attention::kMha;
  HostLayout layout = HostLayout::kLayerFirst;
  uint64_t layers = 0;
  uint64_t heads = 0;
  uint64_t dim = 0;
  uint64_t itemsize = 0;
  uint64_t page_size = 0;
  uint64_t size = 0;  // token slots, a multiple of page_size
};

// The axes of SGLang's host buffer, outermost first (REFERENCE.md, "Host
// layouts"). Empty for pairs SGLang does not define (MLA page_head).
inline std::vector<Axis> PoolAxes(Attention attention, HostLayout layout) {
  using A = Axis;
  if (attention == Attention::kMha) {
    switch (layout) {
      case HostLayout::kLayerFirst:  // (2, L, size, H, D)
        return {A::kKv, A::kLayer, A::kToken, A::kHead, A::kDim};
      case HostLayout::kPageFirst:  // (2, size, L, H, D)
        return {A::kKv, A::kToken, A::kLayer, A::kHead, A::kDim};
      case HostLayout::kPageFirstDirect:  // (2, P, L, ps, H, D)
        return {A::kKv, A::kPage, A::kLayer, A::kInPage, A::kHead, A::kDim};
      case HostLayout::kPageHead:  // (2, P, H, ps, L, D)
        return {A::kKv, A::kPage, A::kHead, A::kInPage, A::kLayer, A::kDim};
    }
  } else {
    switch (layout) {
      case HostLayout::kLayerFirst:  // (L, size, 1, kv_dim)
        return {A::kLayer, A::kToken, A::kHead, A::kDim};
      case HostLayout::kPageFirst:  // (size, L, 1, kv_dim)
        return {A::kToken, A::kLayer, A::kHead, A::kDim};
      case HostLayout::kPageFirstDirect:  // (P, L, ps, 1, kv_dim)
        return {A::kPage, A::kLayer, A::kInPage, A::kHead, A::kDim};
      case HostLayout::kPageHead:
        return {};
    }
  }
  return {};
}

inline bool LayoutDefined(Attention attention, HostLayout layout) {
  return !PoolAxes(attention, layout).empty();
}

// A logical element of the pool.
struct Coord {
  uint64_t kv = 0;  // 0 for MLA
  uint64_t layer = 0;
  uint64_t token = 0;
  uint64_t head = 0;  // 0 for MLA
  uint64_t dim = 0;
};

// One (pointer, size) entry of get_page_buffer_meta, as an offset from the
// buffer's base.
struct Piece {
  uint64_t offset;
  uint64_t size;
  bool operator==(const Piece& o) const {
    return offset == o.offset && size == o.size;
  }
};

class ReferencePool {
 public:
  static constexpr size_t kMaxRank = 8;

  explicit ReferencePool(const PoolSpec& spec)
      : spec_(spec),
        axes_(PoolAxes(spec.attention, spec.layout)),
        tensor_(ShapeOf(spec, axes_)) {
    if (axes_.empty()) throw std::invalid_argument("layout not defined");
    if (spec.attention == Attention::kMla && spec.heads != 1) {
      throw std::invalid_argument("MLA pools have one head");
    }
    if (spec.size % spec.page_size != 0) {
      throw std::invalid_argument("size must be whole pages");
    }
  }

  const PoolSpec& spec() const { return spec_; }
  const std::vector<Axis>& axes() const { return axes_; }
  const RowMajorTensor& tensor() const { return tensor_; }
  uint64_t planes() const { return is_mha() ? 2 : 1; }
  uint64_t num_pages() const { return spec_.size / spec_.page_size; }
  uint64_t TotalBytes() const { return tensor_.NumElements() * spec_.itemsize; }

  // The buffer index tuple holding element `c`.
  std::vector<uint64_t> IndexOf(const Coord& c) const {
    std::vector<uint64_t> index;
    for (Axis axis : axes_) index.push_back(AxisValue(axis, c));
    return index;
  }

  // Byte offset of the first byte of element `c` in the buffer.
  uint64_t ByteOffset(const Coord& c) const {
    if (!is_mha() && (c.kv != 0 || c.head != 0)) {
      throw std::out_of_range("MLA has no V plane and one head");
    }
    std::array<uint64_t, kMaxRank> index;
    for (size_t i = 0; i < axes_.size(); ++i) index[i] = AxisValue(axes_[i], c);
    return tensor_.ElementOffset(index.data(), axes_.size()) * spec_.itemsize;
  }

  // Calls fn(coord) for every logical element of the pool.
  template <typename Fn>
  void ForEachCoord(Fn&& fn) const {
    Coord c;
    for (c.kv = 0; c.kv < planes(); ++c.kv)
      for (c.layer = 0; c.layer < spec_.layers; ++c.layer)
        for (c.token = 0; c.token < spec_.size; ++c.token)
          for (c.head = 0; c.head < spec_.heads; ++c.head)
            for (c.dim = 0; c.dim < spec_.dim; ++c.dim) fn(c);
  }

  // get_data_page(index, flat=True): the byte offsets, in flat order, of the
  // elements of the page starting at token slot `index`. The page tensor is
  // buf[..., index:index+ps, ...] on the token axis, or buf[..., p:p+1, ...]
  // on the page axis (p = index // ps), whichever the layout has.
  std::vector<uint64_t> FlatPageByteOffsets(uint64_t index) const {
    if (index % spec_.page_size != 0) {
      throw std::invalid_argument("index is not the start of a page");
    }
    std::vector<uint64_t> offsets;
    for (size_t axis = 0; axis < axes_.size(); ++axis) {
      if (axes_[axis] == Axis::kToken) {
        offsets = tensor_.SliceElementOffsets(axis, index, spec_.page_size);
      } else if (axes_[axis] == Axis::kPage) {
        offsets = tensor_.SliceElementOffsets(axis, index / spec_.page_size, 1);
      }
    }
    for (uint64_t& offset : offsets) offset *= spec_.itemsize;
    return offsets;
  }

  // The flat page's bytes, read from `pool`.
  std::vector<uint8_t> FlatPage(const uint8_t* pool, uint64_t index) const {
    std::vector<uint8_t> flat;
    for (uint64_t offset : FlatPageByteOffsets(index)) {
      for (uint64_t b = 0; b < spec_.itemsize; ++b) {
        flat.push_back(pool[offset + b]);
      }
    }
    return flat;
  }

  // get_dummy_flat_data_page(): 2*L*ps*H*D (MLA L*ps*kv_dim) elements.
  uint64_t FlatPageElements() const {
    return planes() * spec_.layers * spec_.page_size * spec_.heads * spec_.dim;
  }

  // get_page_buffer_meta(indices), with the pointers as offsets from base,
  // transcribed from REFERENCE.md.
  std::vector<Piece> PageBufferMeta(
      const std::vector<uint64_t>& indices) const {
    const uint64_t L = spec_.layers, H = spec_.heads, D = spec_.dim,
                   it = spec_.itemsize, ps = spec_.page_size, size = spec_.size;
    if (indices.size() % ps != 0) {
      throw std::invalid_argument("len(indices) % page_size != 0");
    }
    std::vector<Piece> pieces;
    for (size_t i = 0; i < indices.size(); i += ps) {
      const uint64_t idx = indices[i];
      if (is_mha()) {
        const uint64_t v_offset = L * size * H * D * it;
        if (spec_.layout == HostLayout::kLayerFirst) {
          for (uint64_t l = 0; l < L; ++l) {
            const uint64_t k = idx * H * D * it + l * size * H * D * it;
            pieces.push_back({k, ps * H * D * it});
            pieces.push_back({k + v_offset, ps * H * D * it});
          }
        } else {
          const uint64_t k = idx * L * H * D * it;
          pieces.push_back({k, L * ps * H * D * it});
          pieces.push_back({k + v_offset, L * ps * H * D * it});
        }
      } else {
        const uint64_t kv_dim = D;
        if (spec_.layout == HostLayout::kLayerFirst) {
          for (uint64_t l = 0; l < L; ++l) {
            pieces.push_back(
                {idx * kv_dim * it + l * size * kv_dim * it, ps * kv_dim * it});
          }
        } else {
          pieces.push_back({idx * L * kv_dim * it, L * ps * kv_dim * it});
        }
      }
    }
    return pieces;
  }

 private:
  static std::vector<uint64_t> ShapeOf(const PoolSpec& spec,
                                       const std::vector<Axis>& axes) {
    std::vector<uint64_t> shape;
    for (Axis axis : axes) {
      switch (axis) {
        case Axis::kKv:
          shape.push_back(2);
          break;
        case Axis::kLayer:
          shape.push_back(spec.layers);
          break;
        case Axis::kToken:
          shape.push_back(spec.size);
          break;
        case Axis::kPage:
          shape.push_back(spec.size / spec.page_size);
          break;
        case Axis::kInPage:
          shape.push_back(spec.page_size);
          break;
        case Axis::kHead:
          shape.push_back(spec.heads);
          break;
        case Axis::kDim:
          shape.push_back(spec.dim);
          break;
      }
    }
    return shape;
  }

  uint64_t AxisValue(Axis axis, const Coord& c) const {
    switch (axis) {
      case Axis::kKv:
        return c.kv;
      case Axis::kLayer:
        return c.layer;
      case Axis::kToken:
        return c.token;
      case Axis::kPage:
        return c.token / spec_.page_size;
      case Axis::kInPage:
        return c.token % spec_.page_size;
      case Axis::kHead:
        return c.head;
      case Axis::kDim:
        return c.dim;
    }
    return 0;
  }

  bool is_mha() const { return spec_.attention == Attention::kMha; }

  PoolSpec spec_;
  std::vector<Axis> axes_;
  RowMajorTensor tensor_;
};

// ---------------------------------------------------------------------------
// The engine's device buffers: per layer a K and a V tensor (MLA: one
// tensor) of shape (slots, H, D); row t is token slot t.
class ReferenceDevice {
 public:
  ReferenceDevice(const PoolSpec& spec, uint64_t slots)
      : spec_(spec), tensor_({slots, spec.heads, spec.dim}) {}

  uint64_t BufferBytes() const {
    return tensor_.NumElements() * spec_.itemsize;
  }
  uint64_t ByteOffset(uint64_t slot, uint64_t head, uint64_t dim) const {
    const uint64_t index[3] = {slot, head, dim};
    return tensor_.ElementOffset(index, 3) * spec_.itemsize;
  }

 private:
  PoolSpec spec_;
  RowMajorTensor tensor_;
};

// Moves, for one layer, host slot host_indices[i] <-> device slot
// device_indices[i], element by element and byte by byte.
// device_planes[kv] is that layer's K (kv = 0) or V (kv = 1) buffer.
inline void ReferenceCopyLayer(const ReferencePool& pool,
                               const ReferenceDevice& device, bool to_device,
                               uint64_t layer,
                               const std::vector<uint64_t>& host_indices,
                               const std::vector<uint64_t>& device_indices,
                               uint8_t* host, uint8_t* const* device_planes) {
  if (host_indices.size() != device_indices.size()) {
    throw std::invalid_argument("index lists differ in length");
  }
  const PoolSpec& s = pool.spec();
  for (size_t i = 0; i < host_indices.size(); ++i) {
    for (uint64_t kv = 0; kv < pool.planes(); ++kv) {
      for (uint64_t h = 0; h < s.heads; ++h) {
        for (uint64_t d = 0; d < s.dim; ++d) {
          const uint64_t host_off =
              pool.ByteOffset({kv, layer, host_indices[i], h, d});
          const uint64_t dev_off = device.ByteOffset(device_indices[i], h, d);
          for (uint64_t b = 0; b < s.itemsize; ++b) {
            if (to_device) {
              device_planes[kv][dev_off + b] = host[host_off + b];
            } else {
              host[host_off + b] = device_planes[kv][dev_off + b];
            }
          }
        }
      }
    }
  }
}

// A position-dependent byte pattern, so that a byte read from the wrong place
// shows.
inline uint8_t PatternByte(uint64_t position, uint64_t seed) {
  uint64_t x = position * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}

// PatternByte-like bytes for a whole buffer, one hash per 8 bytes.
inline std::vector<uint8_t> PatternBuffer(uint64_t bytes, uint64_t seed) {
  std::vector<uint8_t> buffer(bytes);
  for (uint64_t word = 0; word * 8 < bytes; ++word) {
    uint64_t x = word * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    const uint64_t n = bytes - word * 8 < 8 ? bytes - word * 8 : 8;
    std::memcpy(buffer.data() + word * 8, &x, n);
  }
  return buffer;
}

// ---------------------------------------------------------------------------
// Test cases shared by the kernels tests.

// The production geometry of a pool: num_heads = H (MLA 1), head_bytes =
// head_dim * itemsize (MLA kv_dim * itemsize).
inline PoolGeometry ToGeometry(const PoolSpec& spec) {
  PoolGeometry g;
  g.attention = spec.attention;
  g.layout = spec.layout;
  g.num_layers = static_cast<uint32_t>(spec.layers);
  g.num_heads = static_cast<uint32_t>(spec.heads);
  g.head_bytes = static_cast<uint32_t>(spec.dim * spec.itemsize);
  g.page_size = static_cast<uint32_t>(spec.page_size);
  g.token_slots = spec.size;
  return g;
}

// Model dimensions small enough to check every byte: even, odd, and one
// head. MLA cases take layers, dim (as kv_dim) and itemsize, with one head.
struct ModelDims {
  uint64_t layers;
  uint64_t heads;
  uint64_t dim;
  uint64_t itemsize;
};
inline std::vector<ModelDims> SmallModelDims() {
  return {{3, 2, 8, 2}, {2, 3, 5, 1}, {4, 1, 6, 4}};
}
inline std::vector<uint64_t> SmallPageSizes() { return {1, 16, 64}; }
inline std::vector<HostLayout> AllLayouts() {
  return {HostLayout::kLayerFirst, HostLayout::kPageFirst,
          HostLayout::kPageFirstDirect, HostLayout::kPageHead};
}

// Every defined (attention, layout) x page size x `dims`, `pages` pages
// each.
inline std::vector<PoolSpec> AllPools(uint64_t pages,
                                      const std::vector<ModelDims>& dims) {
  std::vector<PoolSpec> specs;
  for (Attention attention : {Attention::kMha, Attention::kMla}) {
    for (HostLayout layout : AllLayouts()) {
      if (!LayoutDefined(attention, layout)) continue;
      for (uint64_t ps : SmallPageSizes()) {
        for (const ModelDims& m : dims) {
          PoolSpec s;
          s.attention = attention;
          s.layout = layout;
          s.layers = m.layers;
          s.heads = attention == Attention::kMha ? m.heads : 1;
          s.dim = m.dim;
          s.itemsize = m.itemsize;
          s.page_size = ps;
          s.size = pages * ps;
          specs.push_back(s);
        }
      }
    }
  }
  return specs;
}

// The same with SmallModelDims().
inline std::vector<PoolSpec> AllSmallPools(uint64_t pages) {
  return AllPools(pages, SmallModelDims());
}

// A gtest-friendly name, e.g. "mha_page_head_ps16_L3_H2_D8_it2".
inline std::string SpecName(const PoolSpec& s) {
  static const char* const kLayouts[] = {"layer_first", "page_first",
                                         "page_first_direct", "page_head"};
  return std::string(s.attention == Attention::kMha ? "mha_" : "mla_") +
         kLayouts[static_cast<int>(s.layout)] + "_ps" +
         std::to_string(s.page_size) + "_L" + std::to_string(s.layers) + "_H" +
         std::to_string(s.heads) + "_D" + std::to_string(s.dim) + "_it" +
         std::to_string(s.itemsize);
}

}  // namespace reference
}  // namespace hostkv

#endif  // HOSTKV_TESTS_KERNELS_REFERENCE_LAYOUT_H_
