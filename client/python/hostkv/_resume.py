"""What a Client needs to resume its session after a hostkvd restart
(server/README.md "While hostkvd is away", deploy/README.md "Restarts and upgrades"):
the imports it registered and the descriptors it passed (a daemon that
adopted its predecessor's state keeps the session's pages but not those),
and the loads and backups it submitted that may not have finished (their
signal records died with the daemon: the resume submits them again).

An operation belongs to the signal segment of the daemon that answered its
submission (TransferResponse.signal_segment_id): it is waited for there and
nowhere else, so no record of another daemon can report it done.
"""
import collections
import contextlib
import os
import threading

_REPLACEMENTS_KEPT = 4096
# Operations tracked for a resume; past this many, finished ones are dropped
# (the daemon has at most signal_slots of a session's in flight).
_PRUNE_AT = 256


class CallGate:
    """Calls of a client pass together; a resume passes alone: no call of
    this client reaches a restarted daemon while the resume has not yet
    submitted again what the previous daemon left unfinished. Thread-safe.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._calls = 0
        self._resumer = None  # the thread resuming, or None

    def enter(self):
        """Before a try of a call; returns whether it counted (for leave).
        Waits while another thread resumes; the resume's own calls pass."""
        with self._lock:
            if self._resumer is None:  # the usual case: one lock, no wait
                self._calls += 1
                return True
            me = threading.get_ident()
            if self._resumer == me:
                return False
            while self._resumer is not None:
                self._cond.wait()
            self._calls += 1
            return True

    def leave(self, counted):
        if counted:
            with self._lock:
                self._calls -= 1
                if self._resumer is not None:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def resume(self):
        """Waits for the calls in flight (each ends quickly when the daemon
        is gone or does not know the session yet), then holds the others."""
        me = threading.get_ident()
        with self._cond:
            while self._resumer is not None:
                self._cond.wait()
            self._resumer = me
            while self._calls > 0:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resumer = None
                self._cond.notify_all()


class SessionRecords:
    """Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self.generation = 0  # resumes so far
        # The current signal segment's id (SessionReply.value; a daemon
        # before segment ids sends 0: then ("g", generation) stands for it).
        self.segment = None
        # segment id -> its SignalSegment (kept mapped: an operation is
        # waited for in its own daemon's records).
        self.segments = {}
        self._imports = {}   # import id -> RegisterDeviceBuffersRequest
        self._passed = {}    # handle -> a duplicate of the passed descriptor
        # (segment, op_id) -> the Operation submitted again for it, or the
        # HostKVError that submitting it again raised.
        self._replacements = collections.OrderedDict()
        # (segment, op_id) -> Operation: submitted, not known finished.
        self._outstanding = collections.OrderedDict()

    def segment_key(self, segment_id):
        """The key of a segment whose daemon gave it `segment_id`."""
        return segment_id if segment_id else self.segment

    def use_segment(self, segment_id, signals):
        """Makes `signals` the current segment. REQUIRES: no call is in
        flight (CallGate.resume, or the session's opening)."""
        key = segment_id if segment_id else ("g", self.generation)
        with self._lock:
            self.segments[key] = signals
            self.segment = key

    def keep_import(self, import_id, request):
        with self._lock:
            self._imports[import_id] = request

    def forget_import(self, import_id):
        with self._lock:
            self._imports.pop(import_id, None)

    def keep_passed(self, handle, fd):
        copy = os.dup(fd)
        with self._lock:
            old = self._passed.pop(handle, None)
            self._passed[handle] = copy
        if old is not None:
            os.close(old)

    def imports(self):
        with self._lock:
            return dict(self._imports)

    def passed(self):
        with self._lock:
            return dict(self._passed)

    def track(self, op, finished):
        """Keeps `op` for a resume until it is known finished; `finished(op)`
        tells (used to drop old ones once many are kept)."""
        with self._lock:
            self._outstanding[(op.segment, op.op_id)] = op
            if len(self._outstanding) < _PRUNE_AT:
                return
            kept = list(self._outstanding.items())
        done = [key for key, o in kept if finished(o)]
        with self._lock:
            for key in done:
                self._outstanding.pop(key, None)

    def take_outstanding(self):
        """Every operation kept, forgetting them (a resume decides their fate)."""
        with self._lock:
            ops, self._outstanding = list(self._outstanding.values()), collections.OrderedDict()
        return ops

    def replacement(self, op):
        with self._lock:
            return self._replacements.get((op.segment, op.op_id))

    def replace(self, op, new_op):
        with self._lock:
            self._replacements[(op.segment, op.op_id)] = new_op
            while len(self._replacements) > _REPLACEMENTS_KEPT:
                self._replacements.popitem(last=False)

    def close(self):
        with self._lock:
            passed, self._passed = self._passed, {}
        for fd in passed.values():
            os.close(fd)
