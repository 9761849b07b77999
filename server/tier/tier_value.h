// The frame of a page value in a storage tier (server/README.md, "Storage tiers"): a
// fixed 32-byte little-endian header, then the page in SGLang's flat format
// (kernels/page_format.h):
//
//   offset size field
//        0    4 magic "HKVP"
//        4    4 format version (kTierValueVersion)
//        8    8 geometry fingerprint (GeometryFingerprint)
//       16    8 page bytes (the flat page's length)
//       24    4 CRC32C of the page bytes (crc32c.h)
//       28    4 reserved, 0
//       32    - the page
//
// A value whose header or checksum does not match what the reader expects is
// a miss (DataLoss), never served.
#ifndef HOSTKV_SERVER_TIER_TIER_VALUE_H_
#define HOSTKV_SERVER_TIER_TIER_VALUE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/pool_geometry.h"

namespace hostkv {

inline constexpr char kTierValueMagic[4] = {'H', 'K', 'V', 'P'};
inline constexpr uint32_t kTierValueVersion = 1;
inline constexpr size_t kTierValueHeaderBytes = 32;

// A 64-bit hash (FNV-1a over a versioned little-endian encoding) of
// everything that decides a flat page's bytes and their meaning: attention
// (MHA/MLA), host layout (the flat axis order is the layout's own),
// num_layers, num_heads, head_bytes, page_size, the dtype (`dtype`: the
// v1::Dtype value; fp16 and bf16 have the same sizes but other bytes) and,
// for MLA, how a row splits into latent and rope parts (`mla_rope_dim`, the
// qk_rope_head_dim; 0 for MHA). Not the pool's size (token_slots): pools of
// one geometry and any size share pages.
// FNV-1a (64-bit) of `bytes`, from `seed` (the standard offset basis by
// default): the hash of GeometryFingerprint, and of long tier namespaces.
inline constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ull;
uint64_t Fnv1a(absl::string_view bytes, uint64_t seed = kFnv1aOffset);

uint64_t GeometryFingerprint(const PoolGeometry& geometry, uint32_t dtype,
                             uint32_t mla_rope_dim = 0);

// The header, then `page`.
std::string FrameValue(uint64_t fingerprint, absl::string_view page);
// The same for a page that `fill` writes in place (page_bytes bytes), e.g.
// straight from a pool's layout (CopyPageToFlat): one copy of the bytes.
std::string FrameValueFilled(uint64_t fingerprint, uint64_t page_bytes,
                             absl::FunctionRef<void(char* page)> fill);

// The page inside `value` (a view into it), if its header says magic,
// version, `expected_fingerprint` and `expected_page_bytes`, the value holds
// exactly header + page, and the page's CRC32C matches. Otherwise DataLoss
// naming the first thing that did not match: "truncated header", "magic",
// "version", "reserved", "geometry", "page bytes", "size" (value shorter or
// longer than its header says), "checksum".
// For a value UnframeValue refused: true if it is another writer's (its
// header is whole but names another magic, version or geometry: a daemon
// of another version, or a foreign key), false if it is damaged (cut short,
// a length or checksum that does not match: torn or corrupted), which a
// reader may delete so that the next writer replaces it.
bool IsForeignValue(absl::string_view value, uint64_t expected_fingerprint);

absl::StatusOr<absl::string_view> UnframeValue(absl::string_view value,
                                               uint64_t expected_fingerprint,
                                               uint64_t expected_page_bytes);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_TIER_VALUE_H_
