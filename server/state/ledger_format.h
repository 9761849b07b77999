// What the state ledgers (pool_ledger.h, daemon_ledger.h) share: their
// checksum and the words that tell a ledger this build can read from one it
// cannot. Private to server/state/.
#ifndef HOSTKV_SERVER_STATE_LEDGER_FORMAT_H_
#define HOSTKV_SERVER_STATE_LEDGER_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace hostkv {

// Bumped whenever a ledger's layout or meaning changes: a daemon refuses a
// ledger of another format (deploy/README.md "Restarts and upgrades").
inline constexpr uint32_t kLedgerFormat = 1;
inline constexpr size_t kLedgerHeaderBytes = 4096;

// A 64-bit checksum of `bytes` (not cryptographic: it finds torn and
// flipped records; the ledgers are readable by the daemon's uid only).
uint64_t LedgerChecksum(const void* data, size_t bytes, uint64_t seed);
// A well-mixed 64-bit function of x (splitmix64's finalizer).
uint64_t LedgerMix(uint64_t x);
// 64 random bits (getrandom).
uint64_t LedgerSalt();

// The common start of every ledger's header.
struct LedgerHeaderStart {
  char magic[8];
  uint32_t format;       // kLedgerFormat
  uint32_t header_bytes;  // kLedgerHeaderBytes
  uint64_t layout;       // the writer's record sizes and limits (LayoutWord)
  char writer[32];       // the writing daemon's version, NUL-terminated
};

// OK if `start` (of a segment of `size` bytes) carries `magic` and this
// build's format and layout; else FailedPrecondition saying what differs
// (`what` names the ledger). `layout` is this build's word.
absl::Status CheckLedgerStart(const LedgerHeaderStart& start, uint64_t size,
                              const char* magic, uint64_t layout,
                              const std::string& what);
void FillLedgerStart(LedgerHeaderStart& start, const char* magic,
                     uint64_t layout);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_STATE_LEDGER_FORMAT_H_
