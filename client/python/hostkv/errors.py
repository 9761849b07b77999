"""Exceptions raised by the hostkv client, one per gRPC status code.

Every failure the daemon reports (over gRPC or the session socket, whose
replies carry the same absl code numbers) raises the subclass of HostKVError
named after its code, carrying the daemon's message:

    try:
        client.alloc("llama", 1 << 20)
    except hostkv.errors.ResourceExhausted as e:
        print(e.message)
"""


class HostKVError(Exception):
    """A failed hostkv call: `code` (the gRPC / absl code number), `message`."""

    code = 2  # UNKNOWN

    def __init__(self, message=""):
        super().__init__(message)
        self.message = message

    @property
    def code_name(self):
        return _NAMES.get(self.code, "UNKNOWN")


class Cancelled(HostKVError):
    code = 1


class Unknown(HostKVError):
    code = 2


class InvalidArgument(HostKVError, ValueError):
    code = 3


class DeadlineExceeded(HostKVError):
    code = 4


class NotFound(HostKVError):
    code = 5


class AlreadyExists(HostKVError):
    code = 6


class PermissionDenied(HostKVError):
    code = 7


class ResourceExhausted(HostKVError):
    code = 8


class FailedPrecondition(HostKVError):
    code = 9


class Aborted(HostKVError):
    code = 10


class OutOfRange(HostKVError, IndexError):
    code = 11


class Unimplemented(HostKVError):
    code = 12


class Internal(HostKVError):
    code = 13


class Unavailable(HostKVError):
    code = 14


class DataLoss(HostKVError):
    code = 15


class Unauthenticated(HostKVError):
    code = 16


class DaemonUnavailable(Unavailable):
    """hostkvd did not answer within the client's reconnect_timeout."""


class SessionLost(FailedPrecondition):
    """hostkvd answers but no longer knows this client's session (a daemon
    restarted without its predecessor's state, or the session was ended):
    what it held is gone. Raised by that call and every later one."""


_BY_CODE = {cls.code: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
    Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)}
_NAMES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION", 10: "ABORTED",
    11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
    15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


def from_code(code, message):
    """The exception for status code number `code` (Unknown if unknown)."""
    cls = _BY_CODE.get(int(code), Unknown)
    error = cls(message)
    if cls is Unknown and int(code) != Unknown.code:
        error.code = int(code)
    return error


def from_rpc_error(error):
    """Converts a grpc.RpcError raised by a unary call."""
    code = error.code()
    number = code.value[0] if code is not None else Unknown.code
    return from_code(number, error.details() or "")
