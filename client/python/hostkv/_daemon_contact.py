"""Whether hostkvd answers, and waiting for it while it does not
(hostkv.Client's calls; server/README.md "While hostkvd is away").

A call that finds the daemon unreachable (UNAVAILABLE or CANCELLED: down,
restarting, draining for an upgrade) waits for it for up to
`reconnect_timeout` seconds, then raises DaemonUnavailable; with wait=False
(or a timeout of 0) it raises Unavailable at once. While it waits, each try
waits (up to 1 s) for the daemon to listen again and goes out the moment it
does, so a call returns within a few milliseconds of the daemon serving. Either
way the client is `away` until a call gets an answer again.

A daemon that answers but no longer knows the session (a new hostkvd that
did not take over the previous one's state, or a session the daemon ended)
makes that call raise SessionLost naming the cause, and every later call
the same at once: what the session held (pages, imports, private pools) is
gone, and waiting will not bring it back.
"""
import logging
import threading
import time

from . import errors

_log = logging.getLogger("hostkv")
_SESSION_GONE = "no open session with this id"
_AWAITS_RESUME = "awaits its resume"
# While the daemon is away: each try waits up to _MAX_PATIENCE for it to
# listen; a try refused faster than _FAST_FAILURE sleeps first (10 ms,
# doubling to 100 ms).
_MAX_PATIENCE = 1.0
_FAST_FAILURE = 0.005
_FIRST_DELAY = 0.01
_MAX_FAST_DELAY = 0.1


class DaemonContact:
    """Thread-safe."""

    def __init__(self, target, reconnect_timeout, resume=None):
        self.target = target
        self.reconnect_timeout = max(0.0, float(reconnect_timeout))
        # resume(): resumes the session with a daemon that adopted its
        # predecessor's state (Client._resume); None: no resume.
        self.resume = resume
        self._lock = threading.Lock()
        self._away_since = None  # time.monotonic() of the first failure
        self._away_reason = ""
        self._lost = None        # SessionLost's message, once lost

    @property
    def away(self):
        """True from a failed contact until a call is answered again."""
        return self._away_since is not None

    @property
    def lost(self):
        """The SessionLost message, or None while the session is alive."""
        return self._lost

    def mark_away(self, reason):
        with self._lock:
            if self._away_since is not None:
                return
            self._away_since = time.monotonic()
            self._away_reason = reason
        _log.warning("hostkv: hostkvd at %s does not answer (%s); calls wait up to "
                     "%.0f s for it", self.target, reason, self.reconnect_timeout)

    def _mark_back(self):
        with self._lock:
            since, self._away_since = self._away_since, None
        if since is not None:
            _log.warning("hostkv: hostkvd at %s answers again after %.1f s", self.target,
                         time.monotonic() - since)

    def _lose(self, message):
        with self._lock:
            was_away = self._away_since is not None or self._lost is not None
            if self._lost is None:
                if was_away:
                    self._lost = (
                        f"hostkvd at {self.target} came back without this session "
                        f"(it was away: {self._away_reason}; the daemon now running did "
                        "not take over its predecessor's state): the session's pages, "
                        f"imports and private pools are gone ({message})")
                else:
                    self._lost = (f"hostkvd at {self.target} no longer knows this session "
                                  f"(ended by the daemon: {message})")
                self._away_since = None
            lost = self._lost
        _log.error("hostkv: %s", lost)
        return lost

    def call(self, fn, wait=True):
        """fn(patience)'s result; its HostKVError otherwise, after waiting as
        the module says. `patience` is None for a first try; while the
        daemon is away it is how long fn may wait for the daemon to listen
        again (gRPC's wait_for_ready), so the call goes out as soon as it
        does instead of after a sleep.

        Every non-answer of a daemon going away is one path: UNAVAILABLE,
        CANCELLED (a daemon draining for SIGTERM or --takeover cancels the
        calls that reach it after its last handler ran: they did nothing,
        and this client never cancels its own calls), a closed session
        socket or command ring. With wait=False it raises Unavailable.
        """
        if self._lost is not None:
            raise errors.SessionLost(self._lost)
        deadline = None
        patience = None
        delay = _FIRST_DELAY
        while True:
            tried = time.monotonic()
            try:
                result = fn(patience)
            except (errors.Unavailable, errors.Cancelled) as e:
                failure = e
            except errors.NotFound as e:
                if _AWAITS_RESUME in e.message and self.resume is not None:
                    try:
                        self.resume()
                    except errors.NotFound as gone:
                        raise errors.SessionLost(self._lose(gone.message)) from None
                    except (errors.Unavailable, errors.Cancelled) as again:
                        failure = again  # gone again in the middle of the resume
                    else:
                        self._mark_back()
                        continue
                elif _SESSION_GONE in e.message:
                    raise errors.SessionLost(self._lose(e.message)) from None
                else:
                    self._mark_back()
                    raise
            except errors.HostKVError:
                self._mark_back()
                raise
            else:
                self._mark_back()
                return result
            message = failure.message or "unavailable"
            self.mark_away(message)
            if not wait or self.reconnect_timeout <= 0:
                if isinstance(failure, errors.Unavailable):
                    raise failure
                raise errors.Unavailable(
                    f"hostkvd at {self.target} is shutting down ({message})") from None
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.reconnect_timeout
            if now >= deadline:
                raise errors.DaemonUnavailable(
                    f"hostkvd at {self.target} did not answer within "
                    f"reconnect_timeout={self.reconnect_timeout:g} s (is it running? "
                    f"last error: {message})") from None
            if now - tried < _FAST_FAILURE:
                # Refused at once (a daemon draining, a socket with no one
                # behind it): not a loop on it.
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, _MAX_FAST_DELAY)
            patience = max(0.0, min(_MAX_PATIENCE, deadline - time.monotonic()))
