"""A CPU "device module": what SGLang reaches through
sglang.srt.utils.get_device_module() (torch.cuda on CUDA), as far as
python/sglang/srt/managers/cache_controller.py @001067ff and
python/sglang/srt/mem_cache/l2_transfer.py @67e863cd / @086fe1aa use it:
Event(enable_timing=...) with record / query / wait / synchronize /
elapsed_time, Stream() with wait_event / synchronize, the stream(s)
context manager and current_stream().

This is a stand-in for the CPU, not a model of CUDA semantics: here every
piece of work is done by the time the call that queued it returns, so an
event is complete as soon as it exists (query() is True, wait() and
synchronize() return at once). What it keeps is bookkeeping a test can
look at: for each event, the stream it was last recorded on and how often
it was recorded; for each stream, the events it was made to wait for.
"""
import contextlib
import itertools
import threading

__all__ = ["Event", "Stream", "current_stream", "stream", "synchronize"]

_stream_ids = itertools.count()
_local = threading.local()


class Stream:
    """A stream; the default stream of each thread is DEFAULT_STREAM."""

    def __init__(self, device=None, priority=0):
        self.stream_id = next(_stream_ids)
        self.device = device
        self.priority = priority
        self.waited_events = []

    def wait_event(self, event):
        self.waited_events.append(event)

    def wait_stream(self, other):
        pass

    def record_event(self, event=None):
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self):
        return True

    def synchronize(self):
        pass

    def __repr__(self):
        return f"<cpu Stream {self.stream_id}>"


DEFAULT_STREAM = Stream()


def current_stream(device=None):
    stack = getattr(_local, "streams", None)
    return stack[-1] if stack else DEFAULT_STREAM


@contextlib.contextmanager
def stream(s):
    """Makes `s` the current stream of this thread (None: no change)."""
    stack = _local.__dict__.setdefault("streams", [])
    stack.append(s if s is not None else current_stream())
    try:
        yield
    finally:
        stack.pop()


class Event:
    """An event that is complete the moment it exists (see the module)."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = enable_timing
        self.recorded_on = None
        self.record_count = 0

    def record(self, stream=None):  # pylint: disable=redefined-outer-name
        self.recorded_on = stream if stream is not None else current_stream()
        self.record_count += 1

    def wait(self, stream=None):  # pylint: disable=redefined-outer-name
        (stream if stream is not None else current_stream()).wait_event(self)

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end_event):
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with enable_timing=True")
        return 0.0


def synchronize(device=None):
    pass
