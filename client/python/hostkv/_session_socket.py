"""The session socket's records (proto/contract/session_socket.h).

Fixed 256-byte SOCK_SEQPACKET records; descriptors travel as SCM_RIGHTS and
the kernel attaches the sender's credentials (SCM_CREDENTIALS) itself, the
daemon having set SO_PASSCRED.
"""
import array
import errno
import os
import socket
import struct

from . import errors

MAGIC = 0x32564B48  # "HKV2"
PROTOCOL_VERSION = 2
SUFFIX = ".session"
SESSION_ID_BYTES = 16
KIND_OPEN, KIND_ATTACH, KIND_PASS_FD, KIND_FETCH_KV_WORD, KIND_FETCH_POOL_SEGMENT = 1, 2, 3, 4, 5
KIND_RESUME = 6  # after a daemon restart: the session's secret in session_id
KIND_OPEN_COMMAND_RING = 7  # the session's command ring (hostkv._command_ring)
FEATURE_COMMAND_RING = 1  # SessionReply.features: the daemon serves kOpenCommandRing
FEATURE_RING_LIST_EVICTIONS = 2  # ... and its ring serves ListEvictions

# SessionMessage {u32 magic, version, kind, pid; u8 session_id[16];
#                 char client_name[216]; u64 import_id}
_MESSAGE = struct.Struct("=IIII16s216sQ")
# SessionReply {u32 code, kind; u64 value; u8 session_id[16];
#               u32 session_number, signal_slots, lease_seconds, features;
#               char message[208]}
_REPLY = struct.Struct("=IIQ16sIIII208s")
assert _MESSAGE.size == 256 and _REPLY.size == 256
CLIENT_NAME_BYTES = 216

# Room for the credentials and a few descriptors, as ReceiveRecord has.
_CONTROL_BYTES = socket.CMSG_SPACE(12) + socket.CMSG_SPACE(4 * 4)
_MSG_CMSG_CLOEXEC = getattr(socket, "MSG_CMSG_CLOEXEC", 0x40000000)


class Reply:
    """A decoded SessionReply (successful: errors raise)."""

    def __init__(self, fields, fd):
        (_, self.kind, self.value, self.session_id, self.session_number,
         self.signal_slots, self.lease_seconds, self.features, _) = fields
        self.fd = fd  # a descriptor passed with the reply, or -1


def connect(socket_path):
    """Connects to "<socket_path>.session". Raises Unavailable."""
    path = socket_path + SUFFIX
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
    except OSError as e:
        sock.close()
        raise errors.Unavailable(
            f"cannot connect to the session socket {path}: {e.strerror}") from None
    return sock


def message(kind, client_name=b"", session_id=b"", import_id=0):
    """A SessionMessage record of `kind`."""
    return _MESSAGE.pack(MAGIC, PROTOCOL_VERSION, kind, os.getpid() & 0xFFFFFFFF,
                         session_id, client_name, import_id)


def exchange(sock, record, pass_fd=-1):
    """Sends `record` (with `pass_fd` as SCM_RIGHTS if >= 0), returns its Reply.

    Raises the reply's error (absl code numbers are gRPC's), or Unavailable
    if the daemon closed the socket. REQUIRES: the caller serializes
    exchanges on `sock`.
    """
    ancillary = []
    if pass_fd >= 0:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pass_fd]))]
    send_error = None
    try:
        sent = sock.sendmsg([record], ancillary, socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
        if sent != len(record):
            send_error = "short send"
    except OSError as e:
        if e.errno == errno.EPERM and pass_fd >= 0:
            # The kernel refused the descriptor for the daemon (SO_PASSRIGHTS
            # off): nothing was sent, no reply comes.
            raise errors.ResourceExhausted(
                "the daemon takes no descriptors from this uid for now "
                "(descriptors it refused from this uid still wait to be "
                "closed); try again later") from None
        # A refused connection has its reply waiting already: read anyway.
        send_error = e.strerror
    try:
        data, control, _, _ = sock.recvmsg(_REPLY.size, _CONTROL_BYTES, _MSG_CMSG_CLOEXEC)
    except OSError:
        data, control = b"", []
    fds = _descriptors(control)
    if len(data) != _REPLY.size:
        _close_all(fds)
        suffix = f" (send: {send_error})" if send_error else ""
        raise errors.Unavailable("the daemon closed the session socket" + suffix)
    fields = _REPLY.unpack(data)
    _close_all(fds[1:])
    code = fields[0]
    if code != 0:
        _close_all(fds[:1])
        text = fields[8].split(b"\0", 1)[0].decode("utf-8", "replace")
        raise errors.from_code(code, text)
    return Reply(fields, fds[0] if fds else -1)


def _descriptors(control):
    fds = []
    for level, kind, data in control:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds.extend(array.array("i", data[:usable]))
    return fds


def _close_all(fds):
    for fd in fds:
        os.close(fd)
