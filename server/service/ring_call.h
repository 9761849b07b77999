// One command-ring call (proto/contract/command_ring.h), run by the same
// RequestHandler method as its gRPC twin: the ring adds no check of its
// own and skips none.
#ifndef HOSTKV_SERVER_SERVICE_RING_CALL_H_
#define HOSTKV_SERVER_SERVICE_RING_CALL_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/pool/pool_registry.h"
#include "server/service/request_handler.h"

namespace hostkv {

// What a ring call answers: `code` (an absl::StatusCode, or kRingUseGrpc)
// and `answer` (the serialized response, or the error's message).
struct RingAnswer {
  uint32_t code = 0;
  std::string answer;
};

// Parses `request` (bytes already copied out of the shared segment) as
// `method`'s request, makes it session `session_id`'s whatever it says,
// and runs it. A call whose answer could exceed `answer_capacity` bytes is
// not run (kRingUseGrpc), nor is one that would wait: a Lookup with a
// storage tier, a Publish whose pages a copy still fills (it changes
// nothing then). The client makes those over gRPC. An unknown method or
// unparsable request is
// InvalidArgument; nothing is changed then. `pools` sizes Alloc's answer.
// Lookup waits for a storage tier until `deadline`.
RingAnswer RunRingCall(RequestHandler& handler, const PoolRegistry& pools,
                       const std::string& session_id, uint32_t method,
                       absl::string_view request, absl::Time deadline,
                       uint64_t answer_capacity);

// The method's name as gRPC and the metrics call it ("Alloc"), or nullptr.
const char* RingMethodName(uint32_t method);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SERVICE_RING_CALL_H_
