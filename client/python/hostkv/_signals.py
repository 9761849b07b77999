"""The session's signal segment: OpSignal records (proto/contract/op_signal.h).

Each record is 64 bytes: {u32 progress (bit 31: failed), u32 reserved,
u64 op_id}. The daemon writes them; the client maps the segment read-only
and waits on `progress` with a shared FUTEX_WAIT, as WaitForLayers does.
"""
import ctypes
import os
import platform
import time
import weakref

from . import errors

RECORD_BYTES = 64
FAILED_BIT = 1 << 31

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.syscall.restype = ctypes.c_long
_MAP_FAILED = ctypes.c_void_p(-1).value
_PROT_READ, _MAP_SHARED = 1, 1
_FUTEX_WAIT = 0  # shared, not FUTEX_PRIVATE: two processes map the word
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "ppc64le": 221, "s390x": 238}[platform.machine()]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class SignalSegment:
    """A read-only mapping of `slots` OpSignal records from `fd`.

    The mapping lives as long as this object (not just until close), so a
    wait racing a close never touches unmapped memory. Thread-safe.
    """

    def __init__(self, fd, slots):
        size = os.fstat(fd).st_size
        if size < slots * RECORD_BYTES:
            raise errors.Internal("the signal segment is smaller than announced")
        self.slots = slots
        length = max(size, 1)
        address = _libc.mmap(None, length, _PROT_READ, _MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise errors.Internal(f"mmap of the signal segment: {os.strerror(err)}")
        self._address = address
        weakref.finalize(self, _libc.munmap, address, length)

    def _words(self, index):
        base = self._address + index * RECORD_BYTES
        return ctypes.c_uint32.from_address(base), ctypes.c_uint64.from_address(base + 8)

    def wait_for_layers(self, index, op_id, layers, timeout):
        """Blocks until `layers` layers of operation `op_id` in record `index` are done.

        Returns when they are (or the record moved on to a later operation);
        raises Aborted if the daemon abandoned the operation, DeadlineExceeded
        after `timeout` seconds.
        """
        progress_word, op_word = self._words(index)
        address = ctypes.c_void_p(ctypes.addressof(progress_word))
        deadline = time.monotonic() + timeout
        while True:
            # progress before op_id: if op_id is still ours afterwards, the
            # progress value belongs to our operation (BeginOpSignal's order).
            progress = progress_word.value
            if op_word.value != op_id:
                return
            if progress & FAILED_BIT:
                raise errors.Aborted(
                    f"operation {op_id} was abandoned by the daemon after "
                    f"{progress & ~FAILED_BIT} layers")
            if progress >= layers:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.DeadlineExceeded(
                    f"operation {op_id}: {progress} of {layers} layers done when the "
                    "wait timed out")
            ts = _Timespec(int(left), int((left - int(left)) * 1e9))
            # ctypes releases the GIL for the call; EAGAIN (the word moved),
            # EINTR and ETIMEDOUT all lead back to the checks above.
            _libc.syscall(ctypes.c_long(_SYS_FUTEX), address, ctypes.c_int(_FUTEX_WAIT),
                          ctypes.c_uint32(progress), ctypes.byref(ts), None,
                          ctypes.c_int(0))
