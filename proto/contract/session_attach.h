// The records exchanged on a session socket (see OpenSessionRequest in
// hostkv.proto): the client sends SessionAttach, the daemon answers
// SessionAttachReply, then the connection stays open for the session's life.
#ifndef HOSTKV_PROTO_CONTRACT_SESSION_ATTACH_H_
#define HOSTKV_PROTO_CONTRACT_SESSION_ATTACH_H_

#include <cstdint>

namespace hostkv {

inline constexpr uint32_t kSessionAttachMagic = 0x31564b48;  // "HKV1"
inline constexpr char kSessionSocketSuffix[] = ".session";

struct SessionAttach {
  uint32_t magic;
  uint32_t version;  // 1
  uint64_t session_id;
};

struct SessionAttachReply {
  uint32_t code;  // absl::StatusCode; 0 = attached
  char message[252];
};

static_assert(sizeof(SessionAttach) == 16, "wire format");
static_assert(sizeof(SessionAttachReply) == 256, "wire format");

}  // namespace hostkv

#endif  // HOSTKV_PROTO_CONTRACT_SESSION_ATTACH_H_
