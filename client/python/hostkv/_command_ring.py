"""The session's command ring (proto/contract/command_ring.h): the hot calls
(alloc, free, load, backup, lookup, release, publish) through shared memory
instead of gRPC.

The request is the same hostkv.v1 message gRPC would carry, serialized into
a slot; the daemon runs it with the same handler and writes the response
back. A call goes over gRPC instead when no slot is free, the request does
not fit a slot, or the daemon answers kRingUseGrpc (an answer that could
exceed the slot). Only on x86-64, whose stores are seen in program order:
this module writes the slot with plain stores (ctypes has no fences), and
the futex syscall that follows orders them before the daemon's wake.
"""
import ctypes
import mmap
import os
import platform
import struct
import threading
import time

from . import errors
from ._signals import _SYS_FUTEX, _Timespec, _libc

MAGIC = 0x52564B48  # "HKVR"
VERSION = 1
HEADER_BYTES = 64
SLOT_HEADER_BYTES = 64
FREE, SUBMITTED, ANSWERED = 0, 1, 2
USE_GRPC = 0x10000
METHODS = {"Alloc": 1, "Free": 2, "Load": 3, "Backup": 4, "Lookup": 5, "Release": 6,
           "Publish": 7, "ListEvictions": 8}
SUPPORTED = platform.machine() in ("x86_64", "AMD64")

_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared futexes: two processes map the words
_INT_MAX = 0x7FFFFFFF
_HEADER = struct.Struct("=IIII")  # magic, version, slots, slot_bytes
# How long a caller polls its slot before sleeping on it: the call blocks
# the caller anyway, and an answer it sleeps through costs a wake-up
# (50-100 µs on some VMs). Calls that take longer (a lookup waiting for the
# storage tier) sleep after this.
_SPIN_NS = 1_000_000
# The first part of it without yielding the CPU: a typical call's answer
# comes in that time, and a copy thread the call woke must not get this CPU
# before the caller sees it.
_SPIN_ALONE_NS = 30_000
_SLICE = _Timespec(0, 50_000_000)  # futex sleeps of 50 ms, between liveness checks


class _Slot:
    __slots__ = ("state", "method", "length", "code", "timeout_ms", "state_addr",
                 "payload")

    def __init__(self, mm, offset, slot_bytes):
        self.state = ctypes.c_uint32.from_buffer(mm, offset)
        self.method = ctypes.c_uint32.from_buffer(mm, offset + 4)
        self.length = ctypes.c_uint32.from_buffer(mm, offset + 8)
        self.code = ctypes.c_uint32.from_buffer(mm, offset + 12)
        self.timeout_ms = ctypes.c_uint32.from_buffer(mm, offset + 16)
        self.state_addr = ctypes.c_void_p(ctypes.addressof(self.state))
        self.payload = (offset + SLOT_HEADER_BYTES, offset + slot_bytes)


class CommandRing:
    """A mapping of the ring behind `fd` (`size` bytes). `hung_up()` tells a
    caller waiting for an answer that the daemon is gone. Thread-safe."""

    def __init__(self, fd, size, hung_up):
        self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        magic, version, slots, slot_bytes = _HEADER.unpack_from(self._mm, 0)
        if (magic != MAGIC or version != VERSION or slots == 0 or
                slot_bytes <= SLOT_HEADER_BYTES or HEADER_BYTES + slots * slot_bytes > size):
            self._mm.close()
            raise errors.Internal(f"the daemon's command ring is not version {VERSION}")
        self._view = memoryview(self._mm)
        self._doorbell = ctypes.c_uint32.from_buffer(self._mm, 16)
        self._doorbell_addr = ctypes.c_void_p(ctypes.addressof(self._doorbell))
        self._slots = [_Slot(self._mm, HEADER_BYTES + i * slot_bytes, slot_bytes)
                       for i in range(slots)]
        self.capacity = slot_bytes - SLOT_HEADER_BYTES
        self._free = list(range(slots))
        self._lock = threading.Lock()
        self._hung_up = hung_up
        self._closed = False
        self.calls = 0

    def call(self, method, request, timeout, lookup_wait_ms=0):
        """(code, answer bytes) of `method` (a METHODS value) with the
        serialized `request`, or None if it must go over gRPC. Raises
        Unavailable if the daemon hangs up, DeadlineExceeded after `timeout`
        seconds (the slot stays the daemon's until it answers)."""
        if len(request) > self.capacity:
            return None
        with self._lock:
            if not self._free or self._closed:
                return None
            index = self._free.pop()
            slot = self._slots[index]
        start, _ = slot.payload
        self._view[start:start + len(request)] = request
        slot.method.value = method
        slot.length.value = len(request)
        slot.timeout_ms.value = lookup_wait_ms
        with self._lock:  # one writer of the doorbell at a time: no lost count
            slot.state.value = SUBMITTED
            self._doorbell.value = (self._doorbell.value + 1) & 0xFFFFFFFF
        _libc.syscall(_SYS_FUTEX, self._doorbell_addr, _FUTEX_WAKE, _INT_MAX, None, None, 0)
        if not self._await_answer(slot, timeout):
            return None  # unreachable: _await_answer raises
        code = slot.code.value
        answer = bytes(self._view[start:start + min(slot.length.value, self.capacity)])
        slot.state.value = FREE
        with self._lock:
            self._free.append(index)
            self.calls += 1
        if code == USE_GRPC:
            return None
        return code, answer

    def _await_answer(self, slot, timeout):
        state = slot.state
        if state.value == ANSWERED:
            return True
        if threading.current_thread() is threading.main_thread():
            self._poll(state)
        # Other threads sleep at once: a Python loop polling holds the
        # interpreter lock, which the main thread (an engine's scheduler)
        # would wait for meanwhile.
        return state.value == ANSWERED or self._sleep_until_answered(slot, timeout)

    @staticmethod
    def _poll(state):
        """Polls `state` for the answer, alone, then yielding the CPU."""
        start = time.perf_counter_ns()
        spin_until, yield_from = start + _SPIN_NS, start + _SPIN_ALONE_NS
        while True:
            for _ in range(32):
                if state.value == ANSWERED:
                    return True
            now = time.perf_counter_ns()
            if now >= spin_until:
                break
            if now >= yield_from:
                os.sched_yield()  # on a busy machine the daemon's thread may wait for this CPU
        return False

    def _sleep_until_answered(self, slot, timeout):
        state = slot.state
        deadline = time.monotonic() + timeout
        while True:
            _libc.syscall(_SYS_FUTEX, slot.state_addr, _FUTEX_WAIT, SUBMITTED,
                          ctypes.byref(_SLICE), None, 0)
            if state.value == ANSWERED:
                return True
            if self._closed or self._hung_up():
                raise errors.Unavailable("the daemon closed the session socket during a call")
            if time.monotonic() >= deadline:
                raise errors.DeadlineExceeded(
                    f"the daemon did not answer a command ring call within {timeout:g} s")

    def close(self):
        """Unmaps the ring once no call uses it (the ctypes views pin the
        mapping; the finalizer of the mmap unmaps it otherwise)."""
        self._closed = True
        self._slots = []
        self._doorbell = None
        try:
            self._view.release()
            self._mm.close()
        except (BufferError, ValueError):
            pass  # a call still holds a view: the mmap's finalizer unmaps it

