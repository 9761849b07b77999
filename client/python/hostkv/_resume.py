"""What a Client needs to resume its session after a hostkvd restart
(server/README.md "While hostkvd is away", deploy/README.md "Restarts and upgrades"):
the imports it registered and the descriptors it passed (a daemon that
adopted its predecessor's state keeps the session's pages but not those),
and the operations in flight (their signal records died with the daemon;
loads and backups may be submitted again).
"""
import collections
import os
import threading

_REPLACEMENTS_KEPT = 4096


class SessionRecords:
    """Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self.generation = 0  # resumes so far
        # generation -> its SignalSegment (kept mapped: an operation of an
        # earlier daemon is checked there before it is submitted again).
        self.segments = {}
        self._imports = {}   # import id -> RegisterDeviceBuffersRequest
        self._passed = {}    # handle -> a duplicate of the passed descriptor
        # (generation, op_id) -> the Operation submitted again for it.
        self._replacements = collections.OrderedDict()

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

    def replacement(self, op):
        with self._lock:
            return self._replacements.get((op.generation, op.op_id))

    def replace(self, op, new_op):
        with self._lock:
            self._replacements[(op.generation, op.op_id)] = new_op
            while len(self._replacements) > _REPLACEMENTS_KEPT:
                self._replacements.popitem(last=False)

    def close(self):
        with self._lock:
            passed, self._passed = self._passed, {}
        for fd in passed.values():
            os.close(fd)
