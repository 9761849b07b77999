// Parses sizes such as "64GiB", "512MiB", "10G" or "4096" for flags and
// config.
#ifndef HOSTKV_SERVER_OPERATIONS_BYTE_SIZE_H_
#define HOSTKV_SERVER_OPERATIONS_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace hostkv {

// Accepts an integer with an optional unit: B, K/KiB, M/MiB, G/GiB, T/TiB
// (powers of 1024) or KB/MB/GB/TB (powers of 1000). InvalidArgument on
// anything else or on overflow.
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_BYTE_SIZE_H_
