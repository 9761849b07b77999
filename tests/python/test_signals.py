"""The signal segment wait (no daemon): a fake segment the test writes."""
import ctypes
import mmap
import os
import struct
import threading
import time

import pytest

from hostkv import _signals, errors

OP = 77


@pytest.fixture
def segment():
    fd = os.memfd_create("fake-signals", os.MFD_CLOEXEC)
    os.ftruncate(fd, 4 * 64)
    writable = mmap.mmap(fd, 4 * 64)
    signals = _signals.SignalSegment(fd, 4)
    os.close(fd)
    yield signals, writable
    writable.close()


def publish(writable, index, progress, op_id=OP):
    """What the daemon does: store, then FUTEX_WAKE every waiter."""
    struct.pack_into("=IIQ", writable, index * 64, progress, 0, op_id)
    anchor = ctypes.c_char.from_buffer(writable, index * 64)
    _signals._libc.syscall(ctypes.c_long(_signals._SYS_FUTEX),
                           ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_int(1),
                           ctypes.c_int(2**31 - 1), None, None, ctypes.c_int(0))
    del anchor


def test_times_out_without_spinning(segment):
    signals, writable = segment
    publish(writable, 1, 1)
    cpu, wall = time.process_time(), time.monotonic()
    with pytest.raises(errors.DeadlineExceeded, match="1 of 3 layers"):
        signals.wait_for_layers(1, OP, 3, timeout=0.5)
    assert time.monotonic() - wall >= 0.5
    assert time.process_time() - cpu < 0.2  # blocked in FUTEX_WAIT, not spinning


def test_wakes_on_progress_and_moves_on(segment):
    signals, writable = segment
    publish(writable, 2, 0)

    def daemon():
        for layers in (1, 2, 3):
            time.sleep(0.05)
            publish(writable, 2, layers)

    t = threading.Thread(target=daemon)
    t.start()
    signals.wait_for_layers(2, OP, 3, timeout=5)
    t.join()
    publish(writable, 2, 0, op_id=OP + 1)  # the record moved on: ours is done
    signals.wait_for_layers(2, OP, 3, timeout=0.1)


def test_failed_bit_aborts(segment):
    signals, writable = segment
    publish(writable, 0, _signals.FAILED_BIT | 1)
    with pytest.raises(errors.Aborted, match="after 1 layers"):
        signals.wait_for_layers(0, OP, 2, timeout=1)


def test_segment_smaller_than_announced():
    fd = os.memfd_create("small", os.MFD_CLOEXEC)
    os.ftruncate(fd, 64)
    try:
        with pytest.raises(errors.Internal):
            _signals.SignalSegment(fd, 2)
    finally:
        os.close(fd)
