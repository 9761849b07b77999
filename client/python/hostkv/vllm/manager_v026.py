"""HostkvManager: vLLM v0.26+'s scheduler-side OffloadingManager
(vllm/v1/kv_offload/base.py) on hostkvd's page cache.

The scheduler thread never waits on the daemon: every method below reads
or writes the Board shared with the SchedulerAgent thread
(scheduler_agent.py), which makes the daemon calls.
  lookup(key)       HIT_PENDING while a store of the key by this instance
                    runs; HIT once the agent holds the key's pages on every
                    rank; MISS when the daemon said it is not cached (that
                    answer is kept miss_ttl seconds) or while the daemon is
                    away; else RETRY, and the key is queued for the agent
                    (vLLM asks again at its next step). A key left without
                    an answer for retry_for seconds is a MISS.
  prepare_load      the held keys, in vLLM's order, for the workers (each
                    takes its own references); the holds stay until
                    complete_load.
  prepare_store     every key not known to be cached (the workers allocate,
                    copy and publish; a key another instance published
                    meanwhile keeps that instance's page). None while the
                    daemon is away: vLLM retries those chunks later.
  complete_store    the keys become lookups' business again; with KV events
                    on, the agent confirms them on every rank -> "stored".
  take_events       stored (confirmed) and removed (daemon evictions).
  reset_cache       drops this instance's holds and answers; blocks shared
                    with other instances stay (see README).
Nothing fails out: vLLM treats an exception here as fatal.
"""
import logging
import time

from vllm.v1.kv_offload import base as vbase

from .scheduler_agent import Board, SchedulerAgent

logger = logging.getLogger("hostkv.vllm")

_MEDIUM = getattr(getattr(vbase, "Medium", None), "CPU", "CPU")


class HostkvBlocks(vbase.LoadStoreSpec):
    """Where blocks are, as the scheduler tells its workers (inside vLLM's
    connector metadata, pickled): the offload keys, in the job's order.
    Never page numbers: each worker finds its own pages in its own rank's
    namespaces."""

    def __init__(self, keys):
        self.keys = [bytes(k) for k in keys]

    def __len__(self):
        return len(self.keys)

    def __repr__(self):
        return f"HostkvBlocks({len(self.keys)} keys)"


class ManagerStats:
    """This scheduler's lookup answers and refused stores since it
    started (for tests and logs; get_stats leaves vLLM's own counters to
    vLLM)."""

    def __init__(self):
        self.hits = self.misses = self.retries = self.pending = 0
        self.lookups = 0  # daemon Lookup runs
        self.stores_refused = 0


class HostkvManager(vbase.OffloadingManager):
    def __init__(self, client, placement, blocks_per_chunk, events=False, hold_seconds=5.0,
                 miss_ttl=1.0, retry_for=0.5, connect=None):
        self._placement = placement
        self._events_on = bool(events)
        self._miss_ttl = float(miss_ttl)
        self._retry_for = float(retry_for)
        self._board = Board()
        self._storing = {}  # key -> stores of it in flight
        self._counted = {}  # frozenset(job keys) -> [keys whose hold prepare_load counted]
        self.stats = ManagerStats()
        self._agent = SchedulerAgent(client, placement, blocks_per_chunk, self._board,
                                     self._events_on, hold_seconds, self.stats,
                                     miss_ttl=miss_ttl, connect=connect)
        self._agent.start()

    # -- lookups and loads ---------------------------------------------

    def lookup(self, key, req_context):
        key = bytes(key)
        b = self._board
        now = time.monotonic()
        away = self._agent.daemon_away()
        with b.lock:
            if key in self._storing:
                self.stats.pending += 1
                return vbase.LookupResult.HIT_PENDING
            away = away or b.away
            if not away:  # while hostkvd is away nothing held is sure to load
                hold = b.held.get(key)
                if hold is not None:
                    hold.since = now
                    self.stats.hits += 1
                    return vbase.LookupResult.HIT
                missed = b.misses.get(key)
                if missed is not None and now - missed < self._miss_ttl:
                    self.stats.misses += 1
                    return vbase.LookupResult.MISS
            asked = b.asked.get(key)
            expired = asked is not None and now - asked > self._retry_for
            if asked is None or expired:
                # Ask (again): this also probes a daemon that was away.
                b.asked[key] = now
                b.queue.append(key)
                b.wake.notify()
            if away or expired:
                self.stats.misses += 1
                return vbase.LookupResult.MISS
            self.stats.retries += 1
            return vbase.LookupResult.RETRY

    def get_load_source(self, key, req_context):
        # Asked only after a HIT (vLLM versions that have hit sources): the
        # blocks come from host memory.
        source = vbase.CacheHitSource
        return getattr(source, "HOST", source.EXTERNAL_UNSPECIFIED)

    def prepare_load(self, keys, req_context):
        keys = [bytes(k) for k in keys]
        b = self._board
        with b.lock:
            counted = []
            for k in keys:
                hold = b.held.get(k)
                if hold is not None:
                    hold.loads += 1
                    counted.append(k)
            self._counted.setdefault(frozenset(keys), []).append(counted)
        if len(counted) < len(keys):
            # Not after a HIT of the same step: the workers look the keys
            # up themselves and hold the load until they find them.
            logger.error("prepare_load: %d of %d keys are not held (no HIT before?)",
                         len(keys) - len(counted), len(keys))
        return HostkvBlocks(keys)

    def touch(self, keys, req_context):
        return  # recency comes from every instance's lookups, loads and publishes

    def complete_load(self, keys, req_context):
        b = self._board
        now = time.monotonic()
        with b.lock:
            jobs = self._counted.get(frozenset(bytes(k) for k in keys))
            if not jobs:
                return
            counted = jobs.pop(0)
            if not jobs:
                del self._counted[frozenset(bytes(k) for k in keys)]
            for k in counted:
                hold = b.held.get(k)
                if hold is not None and hold.loads > 0:
                    hold.loads -= 1
                    hold.since = now  # released after hold_seconds unless asked again

    # -- stores ---------------------------------------------------------

    def prepare_store(self, keys, req_context):
        keys = [bytes(k) for k in keys]
        b = self._board
        away = self._agent.daemon_away()
        with b.lock:
            if away or b.away:
                self.stats.stores_refused += 1
                return None
            to_store = [k for k in keys if k not in b.held and k not in self._storing]
            for k in to_store:
                self._storing[k] = self._storing.get(k, 0) + 1
                b.misses.pop(k, None)
        return vbase.PrepareStoreOutput(keys_to_store=to_store,
                                        store_spec=HostkvBlocks(to_store), evicted_keys=[])

    def complete_store(self, keys, req_context, success=True):
        keys = [bytes(k) for k in keys]
        b = self._board
        with b.lock:
            for k in keys:
                n = self._storing.get(k, 0) - 1
                if n > 0:
                    self._storing[k] = n
                else:
                    self._storing.pop(k, None)
                b.misses.pop(k, None)  # ask the daemon again
            if self._events_on and success and keys:
                b.confirms.extend(keys)
                b.wake.notify()

    # -- requests, steps, events ---------------------------------------

    def on_new_request(self, req_context):
        return vbase.RequestOffloadingContext()

    def on_request_finished(self, req_context):
        return

    def take_events(self):
        if not self._events_on:
            return ()
        with self._board.lock:
            taken, self._board.events = self._board.events, []
        return [vbase.OffloadingEvent(keys=list(keys), medium=_MEDIUM, removed=removed)
                for keys, removed in taken]

    def has_pending_work(self):
        # Questions out (deferred requests ask again) or stored-block events
        # still to confirm or to be taken.
        b = self._board
        with b.lock:
            return bool(b.queue or b.asked or b.confirms or b.confirming or b.events)

    def reset_cache(self):
        # vLLM drops its jobs in flight (no complete_* will come for them)
        # and stores its requests again from their first chunk.
        logger.warning("reset_cache: this instance forgets its lookups and references; the "
                       "blocks stay in hostkvd's shared pool for other instances. After new "
                       "weights, change hostkv_namespace so that old KV is never served.")
        with self._board.lock:
            self._storing.clear()
            self._counted.clear()
            self._board.reset_requested = True
            self._board.asked.clear()
            self._board.queue.clear()
            self._board.wake.notify()

    def get_stats(self):
        # vLLM counts transfers itself from the workers' TransferResults
        # (bytes and seconds are filled in); hostkv's own counters are
        # hostkvd's metrics (pool occupancy, hits, evictions per namespace).
        return None

    def shutdown(self):
        """Gives back every reference and closes the session."""
        self._agent.stop()
        self._agent.close_client()

    close = shutdown
