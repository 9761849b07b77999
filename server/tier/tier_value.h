// The frame of a page value in a storage tier (server/README.md, "Storage tiers"): a
// fixed 32-byte little-endian header, then the page in SGLang's flat format
// (kernels/page_format.h):
//
//   offset size field
//        0    4 magic "HKVP"
//        4    4 format version (kTierValueVersion; 1 is still read)
//        8    8 geometry fingerprint (GeometryFingerprint)
//       16    8 page bytes (the flat page's length)
//       24    4 CRC32C of the page bytes (crc32c.h): the page's digest
//                (server/cache/page_digest.h); a writer checks the bytes it
//                copied against the digest the daemon took at publish
//       28    4 key check: CRC32C of the value's binding (its tier key:
//                ValueBinding in tier_keys.h) extended with the checksum's
//                4 bytes, so a value stored under another key (a store
//                that mixed keys up, a value copied over another) is
//                refused though its frame is whole. Version 1: 0.
//       32    - the page
//
// A value whose header, checksum or key check does not match what the reader
// expects is a miss (DataLoss), never served. Version 1 values (written
// before the key check) are read without it; a daemon of then reads
// version 2 values as another writer's (a miss, left in place).
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
inline constexpr uint32_t kTierValueVersion = 2;
inline constexpr uint32_t kTierValueVersionUnbound = 1;  // read, never written
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

// The header, then `page`; `binding`: what the key check binds the value
// to (the tier key's ValueBinding).
std::string FrameValue(uint64_t fingerprint, absl::string_view page,
                       absl::string_view binding = {});
// The same for a page that `fill` writes in place (page_bytes bytes), e.g.
// straight from a pool's layout (CopyPageToFlat): one copy of the bytes.
std::string FrameValueFilled(uint64_t fingerprint, uint64_t page_bytes,
                             absl::FunctionRef<void(char* page)> fill,
                             absl::string_view binding = {});
// The key check of a page whose checksum is `crc`, bound to `binding`.
uint32_t ValueKeyCheck(absl::string_view binding, uint32_t crc);

// The page inside `value` (a view into it), if its header says magic,
// version, `expected_fingerprint` and `expected_page_bytes`, the value holds
// exactly header + page, and the page's CRC32C matches. Otherwise DataLoss
// naming the first thing that did not match: "truncated header", "magic",
// "version", "reserved", "geometry", "page bytes", "size" (value shorter or
// longer than its header says), "checksum", "key" (a version 2 value whose
// key check is not `binding`'s).
// For a value UnframeValue refused: true if it is another writer's (its
// header is whole but names another magic, version or geometry: a daemon
// of another version, or a foreign key), false if it is damaged (cut short,
// a length or checksum that does not match: torn or corrupted), which a
// reader may delete so that the next writer replaces it.
bool IsForeignValue(absl::string_view value, uint64_t expected_fingerprint);

// The CRC32C field of a framed value's header (the page's digest, as
// server/cache/page_digest.h takes it). REQUIRES: value holds a whole
// header.
uint32_t FrameChecksum(absl::string_view value);

absl::StatusOr<absl::string_view> UnframeValue(absl::string_view value,
                                               uint64_t expected_fingerprint,
                                               uint64_t expected_page_bytes,
                                               absl::string_view binding = {});

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_TIER_VALUE_H_
