#include "server/operations/descriptor_shares.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "proto/contract/session_socket.h"

namespace hostkv {
namespace {

uint32_t Part(uint64_t limit, uint64_t numerator, uint64_t denominator) {
  return static_cast<uint32_t>(
      std::min<uint64_t>(limit * numerator / denominator, 1u << 30));
}

}  // namespace

DescriptorShares ShareDescriptorLimit(uint64_t limit) {
  DescriptorShares s;
  s.limit = limit;
  s.session_connections = std::max<uint32_t>(1, Part(limit, 1, 4));
  s.grpc_connections = std::max<uint32_t>(1, Part(limit, 1, 4));
  s.passed_fds = std::max<uint32_t>(16, Part(limit, 1, 8));
  // The closer needs room for two records' descriptors at least.
  s.refused_fds = std::max<uint64_t>(2 * (kMaxRecordFds + 1), Part(limit, 1, 8));
  s.command_rings = Part(limit, 1, 16);
  return s;
}

uint64_t DescriptorShares::reserve() const {
  const uint64_t shared = uint64_t{session_connections} + grpc_connections +
                          passed_fds + refused_fds + command_rings;
  return limit > shared ? limit - shared : 0;
}

std::string DescriptorShares::ToString() const {
  return absl::StrCat("of ", limit, " descriptors: ", session_connections,
                      " session-socket connections, ", grpc_connections,
                      " gRPC connections, ", passed_fds, " passed, ", refused_fds,
                      " refused waiting to close, ", command_rings,
                      " command rings; ", reserve(), " the daemon's own");
}

bool MayTakeShared(uint64_t of_uid, uint64_t held, uint64_t most) {
  if (held >= most) return false;
  if (held < most - most / 8) return true;
  return of_uid < std::max<uint64_t>(1, most / 64);
}

}  // namespace hostkv
