// Expected bytes for the GPU transfer tests: what the host pool and the
// engine's device KV cache must hold after a backup or a load, with every
// element placed by the independent layout model (tests/kernels/
// reference_layout.h, not the production layout code), and comparisons that
// name the coordinates of the first wrong bytes.
#ifndef HOSTKV_TESTS_GPU_KV_IMAGES_H_
#define HOSTKV_TESTS_GPU_KV_IMAGES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "hostkv/client.h"
#include "hostkv/v1/hostkv.pb.h"
#include "tests/gpu/gpu_engine.h"
#include "tests/kernels/reference_layout.h"

namespace hostkv::gpu_testing {

// The reference model of a pool as the daemon describes it.
reference::PoolSpec ReferenceSpec(const v1::Pool& pool);

// Host token slot of position i of the concatenated `pages`.
uint64_t HostTokenAt(const std::vector<PageRange>& pages, uint32_t page_size,
                     uint64_t i);
// Device slot of position i of the concatenated `runs`.
uint64_t SlotAt(const std::vector<SlotRange>& runs, uint64_t i);

// One byte pattern per buffer of a KV cache, [layer * planes + kv], each
// buffer_bytes() long, different for every buffer and every seed.
using BufferPatterns = std::vector<std::vector<uint8_t>>;
BufferPatterns MakePatterns(const EngineKvCache& cache, uint64_t seed);
// Writes every pattern into its buffer.
absl::Status WritePatterns(const EngineKvCache& cache,
                           const BufferPatterns& patterns);

// Sets in `pool_image` (a whole pool) what a backup of device rows `from`
// of the buffers holding `patterns` into host `pages` writes: element (kv,
// layer, token, head) of position i where the reference model places it.
void OverlayBackup(const reference::ReferencePool& pool,
                   const BufferPatterns& patterns,
                   const std::vector<PageRange>& pages,
                   const std::vector<SlotRange>& from, uint64_t tokens,
                   std::vector<uint8_t>* pool_image);

// What every allocation of `cache` must hold after the pages backed up from
// rows `from` are loaded into rows `to`: `background` everywhere (gaps
// between buffers included), and row to(i) of each buffer equal to row
// from(i) of its pattern.
std::vector<std::vector<uint8_t>> ExpectedCache(
    const EngineKvCache& cache, const BufferPatterns& patterns,
    const std::vector<SlotRange>& from, const std::vector<SlotRange>& to,
    uint64_t tokens, uint8_t background);

// Compares a whole pool; on a mismatch names the wrong bytes by their
// coordinates in the reference model.
::testing::AssertionResult PoolMatches(const reference::ReferencePool& pool,
                                       const std::vector<uint8_t>& expected,
                                       const uint8_t* actual);

// Compares `size` bytes made of rows of `row_bytes`; on a mismatch names
// the row and byte of the first wrong bytes.
::testing::AssertionResult RowsMatch(const std::string& what,
                                     const uint8_t* expected,
                                     const uint8_t* actual, uint64_t size,
                                     uint64_t row_bytes);

// Reads every allocation of `cache` and compares it with `expected`; on a
// mismatch names the buffer, row and byte (or the gap) of the wrong bytes.
::testing::AssertionResult CacheMatches(
    const EngineKvCache& cache,
    const std::vector<std::vector<uint8_t>>& expected);

}  // namespace hostkv::gpu_testing

#endif  // HOSTKV_TESTS_GPU_KV_IMAGES_H_
