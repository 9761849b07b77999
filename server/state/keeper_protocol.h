// The state keeper's wire format (state_keeper.h): fixed 160-byte
// SOCK_SEQPACKET records on "<socket>.state", descriptors as SCM_RIGHTS
// (proto/contract/session_socket.h's SendRecord/ReceiveRecord).
//
//   daemon -> keeper: kDeposit {name} + fd   keeper: kDone (replaces `name`)
//   daemon -> keeper: kRemove {name}         keeper: kDone
//   daemon -> keeper: kCollect               keeper: kItem {name} + fd, ...,
//                                                    kDone {count}
//   daemon -> keeper: kDiscard               keeper: kDone, closes all, exits
// Only the keeper's own uid may connect.
#ifndef HOSTKV_SERVER_STATE_KEEPER_PROTOCOL_H_
#define HOSTKV_SERVER_STATE_KEEPER_PROTOCOL_H_

#include <cstdint>

namespace hostkv {

inline constexpr uint32_t kKeeperMagic = 0x4b564b48;  // "HKVK"
inline constexpr char kStateSocketSuffix[] = ".state";

enum class KeeperKind : uint32_t {
  kDeposit = 1,
  kRemove = 2,
  kCollect = 3,
  kDiscard = 4,
  kItem = 5,
  kDone = 6,
  kError = 7,
};

struct KeeperRecord {
  uint32_t magic;  // kKeeperMagic
  uint32_t kind;   // KeeperKind
  uint64_t count;  // kDone after kCollect: items sent
  char name[144];  // NUL-terminated
};
static_assert(sizeof(KeeperRecord) == 160, "wire format");

}  // namespace hostkv

#endif  // HOSTKV_SERVER_STATE_KEEPER_PROTOCOL_H_
