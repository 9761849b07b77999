"""Pace: something done at most once every `seconds` (asking an absent
hostkvd again, opening a new session), so that a thread calling often
never turns into a busy retry loop."""
import time


class Pace:
    def __init__(self, seconds):
        self.seconds = float(seconds)
        self._last = None

    def due(self):
        """True (and the clock restarts) if `seconds` have passed since the
        last True, or there was none."""
        now = time.monotonic()
        if self._last is not None and now - self._last < self.seconds:
            return False
        self._last = now
        return True
