#include "tests/gpu/kv_images.h"

#include <cstring>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"

namespace hostkv::gpu_testing {
namespace {

constexpr int kMismatchesShown = 4;

const char* AxisName(reference::Axis axis) {
  switch (axis) {
    case reference::Axis::kKv:
      return "kv";
    case reference::Axis::kLayer:
      return "layer";
    case reference::Axis::kToken:
      return "token";
    case reference::Axis::kPage:
      return "page";
    case reference::Axis::kInPage:
      return "in_page";
    case reference::Axis::kHead:
      return "head";
    case reference::Axis::kDim:
      return "dim";
  }
  return "?";
}

// "kv=1 page=3 layer=0 in_page=5 head=2 dim=7 byte=1" for a pool offset.
std::string DescribePoolByte(const reference::ReferencePool& pool,
                             uint64_t offset) {
  const std::vector<uint64_t>& shape = pool.tensor().shape();
  uint64_t element = offset / pool.spec().itemsize;
  std::vector<uint64_t> index(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    index[i] = element % shape[i];
    element /= shape[i];
  }
  std::string out;
  for (size_t i = 0; i < shape.size(); ++i) {
    absl::StrAppend(&out, AxisName(pool.axes()[i]), "=", index[i], " ");
  }
  absl::StrAppend(&out, "byte=", offset % pool.spec().itemsize);
  return out;
}

// "V layer 2 row 17 byte 40", or "a gap", for an allocation offset.
std::string DescribeCacheByte(const EngineKvCache& cache, size_t allocation,
                              uint64_t offset) {
  const KvCacheShape& s = cache.shape();
  for (uint32_t l = 0; l < s.layers; ++l) {
    for (uint32_t kv = 0; kv < s.planes; ++kv) {
      const EngineKvCache::Place p = cache.place(kv, l);
      if (p.allocation != allocation || offset < p.offset ||
          offset >= p.offset + cache.buffer_bytes()) {
        continue;
      }
      const uint64_t in_buffer = offset - p.offset;
      return absl::StrCat(s.planes == 1 ? "latent" : (kv == 0 ? "K" : "V"),
                          " layer ", l, " row ", in_buffer / s.token_stride,
                          " byte ", in_buffer % s.token_stride);
    }
  }
  return "a gap outside every buffer";
}

// Byte-by-byte comparison that names up to kMismatchesShown wrong bytes.
::testing::AssertionResult Compare(
    const std::string& what, const uint8_t* expected, const uint8_t* actual,
    uint64_t size, const std::function<std::string(uint64_t)>& describe) {
  if (std::memcmp(expected, actual, size) == 0) {
    return ::testing::AssertionSuccess();
  }
  uint64_t wrong = 0;
  std::string shown;
  for (uint64_t i = 0; i < size; ++i) {
    if (expected[i] == actual[i]) continue;
    if (wrong++ < kMismatchesShown) {
      absl::StrAppend(&shown, "\n  offset ", i, " (", describe(i),
                      "): ", int{actual[i]}, ", expected ", int{expected[i]});
    }
  }
  return ::testing::AssertionFailure()
         << what << ": " << wrong << " of " << size << " bytes wrong" << shown;
}

}  // namespace

reference::PoolSpec ReferenceSpec(const v1::Pool& pool) {
  const v1::PoolSpec& spec = pool.spec();
  const v1::Geometry& g = spec.geometry();
  reference::PoolSpec s;
  s.attention = g.has_mla() ? Attention::kMla : Attention::kMha;
  switch (spec.layout()) {
    case v1::LAYOUT_PAGE_FIRST:
      s.layout = HostLayout::kPageFirst;
      break;
    case v1::LAYOUT_PAGE_FIRST_DIRECT:
      s.layout = HostLayout::kPageFirstDirect;
      break;
    case v1::LAYOUT_PAGE_HEAD:
      s.layout = HostLayout::kPageHead;
      break;
    default:
      s.layout = HostLayout::kLayerFirst;
      break;
  }
  switch (g.dtype()) {
    case v1::DTYPE_FP32:
      s.itemsize = 4;
      break;
    case v1::DTYPE_FP8_E4M3:
    case v1::DTYPE_FP8_E5M2:
      s.itemsize = 1;
      break;
    default:
      s.itemsize = 2;
      break;
  }
  if (g.has_mla()) {
    s.layers = g.mla().num_layers();
    s.heads = 1;
    s.dim = g.mla().kv_lora_rank() + g.mla().qk_rope_head_dim();
  } else {
    s.layers = g.mha().num_layers();
    s.heads = g.mha().num_kv_heads();
    s.dim = g.mha().head_dim();
  }
  s.page_size = spec.page_size();
  s.size = pool.token_slots();
  return s;
}

uint64_t HostTokenAt(const std::vector<PageRange>& pages, uint32_t page_size,
                     uint64_t i) {
  for (const PageRange& p : pages) {
    const uint64_t tokens = p.num_pages * page_size;
    if (i < tokens) return p.first_page * page_size + i;
    i -= tokens;
  }
  return UINT64_MAX;
}

uint64_t SlotAt(const std::vector<SlotRange>& runs, uint64_t i) {
  for (const SlotRange& r : runs) {
    if (i < r.num_slots) return r.first_slot + i;
    i -= r.num_slots;
  }
  return UINT64_MAX;
}

BufferPatterns MakePatterns(const EngineKvCache& cache, uint64_t seed) {
  const uint64_t buffers =
      uint64_t{cache.shape().layers} * cache.shape().planes;
  BufferPatterns patterns;
  for (uint64_t b = 0; b < buffers; ++b) {
    patterns.push_back(
        reference::PatternBuffer(cache.buffer_bytes(), seed * 1000003 + b));
  }
  return patterns;
}

absl::Status WritePatterns(const EngineKvCache& cache,
                           const BufferPatterns& patterns) {
  const KvCacheShape& s = cache.shape();
  for (uint32_t l = 0; l < s.layers; ++l) {
    for (uint32_t kv = 0; kv < s.planes; ++kv) {
      absl::Status status = cache.Write(kv, l, patterns[l * s.planes + kv]);
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

void OverlayBackup(const reference::ReferencePool& pool,
                   const BufferPatterns& patterns,
                   const std::vector<PageRange>& pages,
                   const std::vector<SlotRange>& from, uint64_t tokens,
                   std::vector<uint8_t>* pool_image) {
  const reference::PoolSpec& s = pool.spec();
  const uint64_t planes = pool.planes();
  const uint64_t head_bytes = s.dim * s.itemsize;
  const reference::ReferenceDevice device(
      s, patterns[0].size() / (s.heads * head_bytes));
  for (uint64_t i = 0; i < tokens; ++i) {
    const uint64_t host = HostTokenAt(pages, s.page_size, i);
    const uint64_t slot = SlotAt(from, i);
    for (uint64_t kv = 0; kv < planes; ++kv) {
      for (uint64_t l = 0; l < s.layers; ++l) {
        const std::vector<uint8_t>& pattern = patterns[l * planes + kv];
        for (uint64_t h = 0; h < s.heads; ++h) {
          // The D elements of one head are contiguous in every layout.
          std::memcpy(pool_image->data() + pool.ByteOffset({kv, l, host, h, 0}),
                      pattern.data() + device.ByteOffset(slot, h, 0),
                      head_bytes);
        }
      }
    }
  }
}

std::vector<std::vector<uint8_t>> ExpectedCache(
    const EngineKvCache& cache, const BufferPatterns& patterns,
    const std::vector<SlotRange>& from, const std::vector<SlotRange>& to,
    uint64_t tokens, uint8_t background) {
  std::vector<std::vector<uint8_t>> images;
  for (const DeviceMemory& memory : cache.allocations()) {
    images.emplace_back(memory.size(), background);
  }
  const KvCacheShape& s = cache.shape();
  for (uint32_t l = 0; l < s.layers; ++l) {
    for (uint32_t kv = 0; kv < s.planes; ++kv) {
      const EngineKvCache::Place p = cache.place(kv, l);
      const std::vector<uint8_t>& pattern = patterns[l * s.planes + kv];
      for (uint64_t i = 0; i < tokens; ++i) {
        std::memcpy(images[p.allocation].data() + p.offset +
                        SlotAt(to, i) * s.token_stride,
                    pattern.data() + SlotAt(from, i) * s.token_stride,
                    s.token_stride);
      }
    }
  }
  return images;
}

::testing::AssertionResult PoolMatches(const reference::ReferencePool& pool,
                                       const std::vector<uint8_t>& expected,
                                       const uint8_t* actual) {
  return Compare(
      "host pool", expected.data(), actual, expected.size(),
      [&](uint64_t offset) { return DescribePoolByte(pool, offset); });
}

::testing::AssertionResult RowsMatch(const std::string& what,
                                     const uint8_t* expected,
                                     const uint8_t* actual, uint64_t size,
                                     uint64_t row_bytes) {
  return Compare(what, expected, actual, size, [&](uint64_t offset) {
    return absl::StrCat("row ", offset / row_bytes, " byte ",
                        offset % row_bytes);
  });
}

::testing::AssertionResult CacheMatches(
    const EngineKvCache& cache,
    const std::vector<std::vector<uint8_t>>& expected) {
  for (size_t a = 0; a < cache.allocations().size(); ++a) {
    absl::StatusOr<std::vector<uint8_t>> actual = cache.ReadAllocation(a);
    if (!actual.ok()) {
      return ::testing::AssertionFailure() << actual.status();
    }
    ::testing::AssertionResult same = Compare(
        absl::StrCat("device allocation ", a), expected[a].data(),
        actual->data(), expected[a].size(),
        [&](uint64_t offset) { return DescribeCacheByte(cache, a, offset); });
    if (!same) return same;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace hostkv::gpu_testing
