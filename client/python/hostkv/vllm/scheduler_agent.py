"""The scheduler side's only contact with hostkvd (vLLM v0.26+): a thread
that asks what the scheduler's lookups need, holds references on what it
finds, releases them, and reads evictions. vLLM's scheduler thread never
calls the daemon: it reads and writes the shared Board (under its lock)
and wakes this thread.

What the thread does, each round:
  lookups   the keys lookup() queued, per KV cache group in the order
            asked: Lookup(acquire) of their page keys in every rank's
            namespace. The run found on every rank is held (a "hold": one
            reference per page per rank, so that no instance's allocation
            evicts it before the load that follows); the first key after it
            is a miss; the keys after that are asked again as a run of
            their own (at most MAX_CALLS calls per group per round).
  releases  holds prepare_load no longer needs (complete_load), holds no
            load claimed within hold_seconds, and everything at reset.
  confirms  with KV events on: the keys of completed stores, found on
            every rank -> "stored" events.
  evictions with KV events on: ListEvictions of every (group, rank)
            namespace -> "removed" events.
A daemon call that fails (hostkvd away past reconnect_timeout, the
session lost) marks the daemon away: lookups answer MISS until a call
succeeds again.
"""
import logging
import threading
import time

from .. import errors
from .._pace import Pace
from ..cache_calls import page_list, page_runs
from .chunks import group_of, page_keys

logger = logging.getLogger("hostkv.vllm")

MAX_CALLS = 16          # Lookup runs per group per round
DELAYED_RELEASE_SECONDS = 60.0
RECONNECT_SECONDS = 5.0
EVICTIONS_PER_CALL = 2048
EVICTION_POLL_SECONDS = 0.05


class Hold:
    """References the scheduler's session holds on one offload key's
    pages: per rank the page numbers (blocks_per_chunk of them)."""
    __slots__ = ("group", "pages_by_rank", "loads", "since")

    def __init__(self, group, pages_by_rank):
        self.group = group
        self.pages_by_rank = pages_by_rank
        self.loads = 0
        self.since = time.monotonic()


class Board:
    """What the scheduler thread and the agent share (guarded by `lock`)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.held = {}        # key -> Hold
        self.misses = {}      # key -> when the daemon answered "not cached"
        self.asked = {}       # key -> when it was queued
        self.queue = []       # keys to look up, in the order asked
        self.releases = []    # Holds to release
        self.confirms = []    # keys of completed stores (events on)
        self.events = []      # [(keys, removed)] for take_events
        self.away = False     # the last daemon call failed
        self.stopping = False
        self.reset_requested = False
        self.confirming = False  # the agent works on confirms taken off the board


class SchedulerAgent:
    def __init__(self, client, placement, blocks_per_chunk, board, events, hold_seconds,
                 stats, miss_ttl=1.0, connect=None):
        self._client = client
        self._placement = placement
        self._f = int(blocks_per_chunk)
        self._board = board
        self._events = bool(events)
        self._hold_seconds = float(hold_seconds)
        self._stats = stats
        self._cursors = {}  # (pool, namespace) -> ListEvictions cursor (None: not read yet)
        self._retry = []    # Holds whose release failed while hostkvd was away
        self._delayed = []  # (when, Hold): references a reset gives back later
        self._connect = connect
        self._reconnects = Pace(RECONNECT_SECONDS)
        self._miss_ttl = float(miss_ttl)
        self._last_eviction_poll = 0.0
        self._thread = threading.Thread(target=self._run, name="hostkv-vllm-scheduler",
                                        daemon=True)

    def start(self):
        if self._events:  # read on the agent's thread: "from now on" once each pool exists
            for gid in self._placement.group_ids:
                for place in self._placement.places(gid):
                    self._cursors[place] = None
        self._thread.start()

    def daemon_away(self):
        """Whether the last contact with hostkvd failed (no call made)."""
        c = self._client
        return bool(c.daemon_away or c.session_lost)

    def close_client(self):
        self._client.close()

    def stop(self):
        b = self._board
        with b.lock:
            b.stopping = True
            b.wake.notify()
        self._thread.join(timeout=30)

    # -- the loop -------------------------------------------------------

    def _run(self):
        b = self._board
        while True:
            with b.lock:
                if not b.stopping and not (b.queue or b.releases or b.confirms or
                                           b.reset_requested):
                    b.wake.wait(timeout=EVICTION_POLL_SECONDS if self._events else 0.5)
                if b.stopping:
                    releases = list(b.held.values()) + b.releases
                    b.held.clear()
                    b.releases = []
                    break
                queue, b.queue = b.queue, []
                releases, b.releases = b.releases, []
                confirms, b.confirms = b.confirms, []
                b.confirming = bool(confirms)
                if b.reset_requested:
                    b.reset_requested = False
                    # Holds a load still counts on: given back later, once
                    # the workers surely took their own references.
                    now = time.monotonic()
                    for h in b.held.values():
                        if h.loads:
                            self._delayed.append((now + DELAYED_RELEASE_SECONDS, h))
                        else:
                            releases.append(h)
                    b.held.clear()
                    b.misses.clear()
                releases += self._expired_holds()
                self._prune_misses()
            try:
                self._session_check()
                now = time.monotonic()
                releases += [h for t, h in self._delayed if t <= now]
                self._delayed = [(t, h) for t, h in self._delayed if t > now]
                if self._retry and not self._client.daemon_away:
                    releases, self._retry = releases + self._retry, []
                self._release(releases)
                if queue:
                    self._lookups(queue)
                if confirms:
                    self._confirm(confirms)
                    with b.lock:
                        b.confirming = False
                self._poll_evictions()
            except Exception:  # pylint: disable=broad-except
                logger.exception("hostkv.vllm scheduler agent")
        self._release(releases)

    def _expired_holds(self):
        now = time.monotonic()
        b = self._board
        gone = [k for k, h in b.held.items()
                if h.loads == 0 and now - h.since > self._hold_seconds]
        return [b.held.pop(k) for k in gone]

    def _prune_misses(self):
        b = self._board
        if len(b.misses) > 4096:
            now = time.monotonic()
            b.misses = {k: t for k, t in b.misses.items() if now - t < self._miss_ttl}

    def _session_check(self):
        """A daemon that came back without this session's state: its
        references went with it; a new session, at most every
        RECONNECT_SECONDS."""
        if not self._client.session_lost or self._connect is None:
            return
        if not self._reconnects.due():
            return
        try:
            client = self._connect()
        except errors.HostKVError as e:
            logger.warning("no new hostkv session for the scheduler yet: %s", e)
            return
        old, self._client = self._client, client
        old.close()
        b = self._board
        with b.lock:
            b.held.clear()
            b.misses.clear()
        self._retry, self._delayed = [], []
        self._cursors = {place: None for place in self._cursors}
        logger.warning("hostkvd lost the scheduler's session; a new one is open")

    # -- daemon calls ---------------------------------------------------

    def _call(self, what, fn, *args, **kw):
        """One daemon call; None (and the daemon marked away) when it fails
        for a reason other than NotFound / ResourceExhausted, which are
        raised."""
        try:
            out = fn(*args, **kw)
        except (errors.NotFound, errors.ResourceExhausted):
            self._mark(False, "")  # it answered
            raise
        except errors.HostKVError as e:
            self._mark(True, f"{what}: {e.code_name} {e.message}")
            return None
        self._mark(False, "")
        return out

    def _mark(self, away, reason):
        b = self._board
        with b.lock:
            if b.stopping:
                return
            if away and reason and not b.away:
                logger.warning("hostkvd away (%s): lookups answer MISS, stores store "
                               "nothing until it answers again", reason)
            elif not away and b.away:
                logger.info("hostkvd answers again")
            b.away = away

    def _lookups(self, queue):
        by_group = {}
        for key in queue:
            by_group.setdefault(group_of(key), []).append(key)
        try:
            for gid, keys in by_group.items():
                remaining, calls = keys, 0
                while remaining and calls < MAX_CALLS:
                    calls += 1
                    hits = self._hold_run(gid, remaining)
                    if hits is None:  # the daemon is away or the pool does not exist
                        break
                    if hits < len(remaining):
                        self._answer_miss(remaining[hits])
                        remaining = remaining[hits + 1:]
                    else:
                        remaining = []
        finally:
            # Every key of the round leaves `asked`: an unanswered one is
            # queued again when the scheduler asks for it again.
            b = self._board
            with b.lock:
                for k in queue:
                    b.asked.pop(k, None)

    def _hold_run(self, gid, keys):
        """Holds the leading run of `keys` cached on every rank; the run's
        length, or None."""
        f = self._f
        pks = [pk for k in keys for pk in page_keys(k, f)]
        found = []
        try:
            for pool, namespace in self._placement.places(gid):
                got = self._lookup_acquire(pool, namespace, pks)
                if got is None:
                    self._release_pages(gid, found)
                    return None
                found.append(got)
        except errors.NotFound:  # some rank's pool does not exist (yet)
            self._release_pages(gid, found)
            for k in keys:
                self._answer_miss(k)
            return None
        self._stats.lookups += 1
        run = min(len(p) for p in found) // f
        for r, pages in enumerate(found):  # give back what lies past the common run
            if len(pages) > run * f:
                self._release_pages(gid, [[]] * r + [pages[run * f:]])
                del pages[run * f:]
        b = self._board
        duplicates = []
        with b.lock:
            now = time.monotonic()
            for i, key in enumerate(keys[:run]):
                hold = Hold(gid, [p[i * f:(i + 1) * f] for p in found])
                if key in b.held:
                    duplicates.append(hold)
                    b.held[key].since = now
                else:
                    b.held[key] = hold
                b.misses.pop(key, None)
                b.asked.pop(key, None)
        self._release(duplicates)
        return run

    def _lookup_acquire(self, pool, namespace, pks):
        try:
            got = self._call("Lookup", self._client.lookup, pool, namespace, pks,
                             acquire=True)
        except errors.ResourceExhausted:
            # The session's references are capped: give back every hold no
            # load claims, then once more.
            self._release(self._idle_holds())
            try:
                got = self._call("Lookup", self._client.lookup, pool, namespace, pks,
                                 acquire=True)
            except errors.ResourceExhausted as e:
                logger.warning("lookup of %d pages: %s; answered as a miss", len(pks), e)
                return []
        return None if got is None else page_list(got.pages)

    def _idle_holds(self):
        b = self._board
        with b.lock:
            now = time.monotonic()
            idle = [k for k, h in b.held.items() if h.loads == 0 and now - h.since > 1.0]
            return [b.held.pop(k) for k in idle]

    def _answer_miss(self, key):
        b = self._board
        with b.lock:
            b.misses[key] = time.monotonic()
            b.asked.pop(key, None)

    def _release(self, holds):
        for hold in holds:
            self._release_pages(hold.group, hold.pages_by_rank)

    def _release_pages(self, gid, pages_by_rank):
        """Gives the references back; those the daemon could not take back
        now (away) are given back later, so none outlives its hold."""
        for r, pages in enumerate(pages_by_rank):
            if not pages:
                continue
            pool = self._placement.pool(gid, r)
            try:
                self._client.release(pool, page_runs(pages))
            except errors.FailedPrecondition:
                # All or nothing, and a resume may have dropped one of them
                # (its key moved): the others one by one.
                for page in pages:
                    try:
                        self._client.release(pool, [(page, 1)])
                    except errors.FailedPrecondition:
                        pass
                    except errors.HostKVError:
                        self._retry.append(Hold(gid, [[]] * r + [[page]]))
            except errors.HostKVError:
                self._retry.append(Hold(gid, [[]] * r + [list(pages)]))

    def _confirm(self, keys):
        """Keys of completed stores found on every rank -> a "stored" event.
        A job's keys of one group are consecutive chunks: one Lookup per
        rank answers a run; after a key that is missing, the rest is asked
        as a run of its own."""
        by_group = {}
        for key in keys:
            by_group.setdefault(group_of(key), []).append(key)
        stored = []
        for gid, remaining in by_group.items():
            calls = 0
            while remaining and calls < MAX_CALLS:
                calls += 1
                run = self._cached_run(gid, remaining)
                if run is None:
                    break
                stored += remaining[:run]
                remaining = remaining[run + 1:]
        if stored:
            with self._board.lock:
                self._board.events.append((stored, False))

    def _cached_run(self, gid, keys):
        """How many keys, from the first, are cached on every rank (no
        references taken); None if the daemon did not answer."""
        f = self._f
        pks = [pk for k in keys for pk in page_keys(k, f)]
        run = len(keys)
        for pool, namespace in self._placement.places(gid):
            try:
                got = self._call("Lookup", self._client.lookup, pool, namespace, pks)
            except (errors.NotFound, errors.ResourceExhausted):
                return 0
            if got is None:
                return None
            run = min(run, got.hits // f)
        return run

    def _eviction_cursor(self, pool, namespace):
        """The log's current end (evictions before it are not news), or
        None while the pool does not exist."""
        try:
            return self._client.list_evictions(pool, namespace, 0, max_keys=0).next
        except errors.HostKVError:
            return None

    def _poll_evictions(self):
        if not self._events:
            return
        now = time.monotonic()
        if now - self._last_eviction_poll < EVICTION_POLL_SECONDS:
            return
        self._last_eviction_poll = now
        removed, seen = [], set()
        for (pool, namespace), cursor in list(self._cursors.items()):
            if cursor is None:
                self._cursors[(pool, namespace)] = self._eviction_cursor(pool, namespace)
                continue
            while True:
                try:
                    got = self._call("ListEvictions", self._client.list_evictions, pool,
                                     namespace, cursor, EVICTIONS_PER_CALL)
                except (errors.NotFound, errors.ResourceExhausted):
                    break
                if got is None:
                    return
                cursor = self._cursors[(pool, namespace)] = got.next
                if got.missed:
                    logger.warning("%d evictions in pool %s left the daemon's log unread",
                                   got.missed, pool)
                for pk in got.keys:
                    key = bytes(pk) if self._f == 1 else bytes(pk)[:-2]
                    if key not in seen:
                        seen.add(key)
                        removed.append(key)
                if len(got.keys) < EVICTIONS_PER_CALL:
                    break
        if removed:
            with self._board.lock:
                self._board.events.append((removed, True))
