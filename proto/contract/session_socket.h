// The session socket's wire format (see "Session socket" in hostkv.proto),
// shared by hostkvd and the client library: fixed-size SOCK_SEQPACKET
// records, with file descriptors (SCM_RIGHTS) and, towards the daemon, the
// sender's credentials (SCM_CREDENTIALS) as ancillary data.
//
//   client -> daemon: SessionMessage {kOpen}    daemon: SessionReply + signal fd
//   client -> daemon: SessionMessage {kAttach}  daemon: SessionReply + signal fd
//   client -> daemon: SessionMessage {kPassFd} + one memfd
//                                               daemon: SessionReply {value}
//   client -> daemon: SessionMessage {kFetchKvWord, import_id}
//                                               daemon: SessionReply + memfd
//   client -> daemon: SessionMessage {kFetchPoolSegment, client_name = pool}
//                                               daemon: SessionReply {value} + fd
//   client -> daemon: SessionMessage {kResume}  daemon: SessionReply + signal fd
//   client -> daemon: SessionMessage {kOpenCommandRing}
//                                               daemon: SessionReply {value} + ring fd
// One session per connection; it ends when the connection closes.
#ifndef HOSTKV_PROTO_CONTRACT_SESSION_SOCKET_H_
#define HOSTKV_PROTO_CONTRACT_SESSION_SOCKET_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "proto/contract/shm_segment.h"

namespace hostkv {

inline constexpr uint32_t kSessionMagic = 0x32564b48;  // "HKV2"
inline constexpr uint32_t kSessionProtocolVersion = 2;
inline constexpr char kSessionSocketSuffix[] = ".session";
// Session ids are 16 random bytes.
inline constexpr size_t kSessionIdBytes = 16;

enum class SessionMessageKind : uint32_t {
  // Opens a session bound to the sender (its uid, gid and pid).
  kOpen = 1,
  // Attaches the session `session_id` (opened with the OpenSession RPC).
  kAttach = 2,
  // Hands the daemon one memfd (SCM_RIGHTS) of device buffers, sealed with
  // F_SEAL_SHRINK; the reply's `value` is the handle RegisterDeviceBuffers
  // names it by (DeviceBuffer.passed_fd). Needs an attached session. This is
  // the only record that may carry a descriptor, and only this one: any
  // other descriptor, extra descriptors, or descriptors on other records are
  // refused (InvalidArgument) and closed.
  kPassFd = 3,
  // Asks for the "KV written" page of CUDA import `import_id` (registered
  // with gpu_signals by this session): the reply carries a memfd of one
  // 4 KiB page, sealed against resizing, whose first 8 bytes are the word
  // the daemon's stream waits on. The engine maps it, registers it with
  // CUDA (cudaHostRegister, mapped) and writes its marks into it with
  // cuStreamWriteValue64 (GpuSignals::AttachKvWord / MarkKvWritten).
  // Needs an attached session.
  kFetchKvWord = 4,
  // Asks for a descriptor of the shared-memory segment of the pool named in
  // `client_name` (the engine's zero-copy view of its host pages: SGLang's
  // kv_buffer and get_page_buffer_meta). The reply's `value` is 1 when the
  // descriptor is read-write (the peer may administer the pool: its owner's
  // uid or root), 0 when read-only (any other session the pool admits).
  // PermissionDenied for a pool the session may not use. Needs an attached
  // session.
  kFetchPoolSegment = 5,
  // Resumes, after a daemon restart, the session `session_id` (its secret)
  // that the previous daemon left in its state: the reply is kOpen's (the
  // same session number, a new signal segment). The session keeps its
  // pages; its imports, passed descriptors, operations in flight and
  // references on cached pages did not survive. NotFound ("did not
  // survive") when the daemon holds no such session; PermissionDenied for
  // another uid; FailedPrecondition if the session never went away.
  kResume = 6,
  // Asks for the session's command ring (proto/contract/command_ring.h):
  // the reply carries a read-write memfd of the ring's segment, `value` its
  // size in bytes. One ring per connection (asking again returns the same
  // ring); ResourceExhausted when the daemon runs its most rings (the
  // client then stays on gRPC). Needs an attached session.
  kOpenCommandRing = 7,
};

struct SessionMessage {
  uint32_t magic;    // kSessionMagic
  uint32_t version;  // kSessionProtocolVersion
  uint32_t kind;     // SessionMessageKind
  uint32_t pid;      // kOpen: informational (the kernel's word is used)
  uint8_t session_id[kSessionIdBytes];  // kAttach
  char client_name[216];  // kOpen; kFetchPoolSegment: the pool; NUL-terminated
  // kFetchKvWord: the import; kPassFd: 0, or the handle to give the
  // descriptor (a client passing it again after a restart).
  uint64_t import_id;
};

// SessionReply::features: what this daemon serves beyond version 2's
// records (a client asks for nothing a daemon did not announce: an unknown
// record kind ends the connection).
inline constexpr uint32_t kSessionFeatureCommandRing = 1;  // kOpenCommandRing
// The command ring also serves RingMethod::kListEvictions.
inline constexpr uint32_t kSessionFeatureRingListEvictions = 2;

struct SessionReply {
  uint32_t code;  // absl::StatusCode; 0 = done
  uint32_t kind;  // the request's kind
  // kPassFd: the handle; kFetchPoolSegment: 1 = writable; kOpen, kAttach,
  // kResume: the signal segment's id (TransferResponse.signal_segment_id)
  uint64_t value;
  uint8_t session_id[kSessionIdBytes];  // kOpen
  uint32_t session_number;              // kOpen, kAttach
  uint32_t signal_slots;                // kOpen, kAttach (segment as an fd)
  uint32_t lease_seconds;               // kOpen
  uint32_t features;  // kOpen, kAttach, kResume: kSessionFeature* bits
  char message[208];  // the error, NUL-terminated
};

static_assert(sizeof(SessionMessage) == 256, "wire format");
static_assert(sizeof(SessionReply) == 256, "wire format");

// The most descriptors one record can carry (the kernel's SCM_MAX_FD).
inline constexpr size_t kMaxRecordFds = 253;

// What arrived with a record.
struct ReceivedRecord {
  ssize_t bytes = 0;  // recvmsg's result; 0 = closed, < 0 = error (errno)
  bool truncated = false;  // the record or its ancillary data was cut
  // Every descriptor that came, in order: the first in `fd`, the others in
  // `more_fds`. None is closed here: the receiver decides how (hostkvd must
  // not close a client's descriptor on a thread where the close can block).
  ScopedFd fd;
  std::vector<ScopedFd> more_fds;
  bool has_credentials = false;  // SCM_CREDENTIALS (needs SO_PASSCRED)
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;

  // How many descriptors came.
  size_t fd_count() const { return (fd.get() >= 0 ? 1 : 0) + more_fds.size(); }
};

// Receives one record of at most `size` bytes into `data`; never blocks when
// `dont_wait`. There is room for kMaxRecordFds descriptors, so the kernel
// drops none of them (a dropped one would be released in this thread).
ReceivedRecord ReceiveRecord(int socket, void* data, size_t size,
                             bool dont_wait);

// Sends one record, with `pass_fd` (if >= 0) as SCM_RIGHTS. Returns false
// (errno set) if it could not be sent whole.
bool SendRecord(int socket, const void* data, size_t size, int pass_fd = -1);

// A record of `kind` with its header (magic, version, this process's pid)
// and `client_name` (cut to fit, NUL-terminated) filled in.
SessionMessage NewSessionMessage(SessionMessageKind kind,
                                 std::string_view client_name = {});

}  // namespace hostkv

#endif  // HOSTKV_PROTO_CONTRACT_SESSION_SOCKET_H_
