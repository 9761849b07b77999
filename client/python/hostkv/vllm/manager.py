"""HostkvOffloadingManager: vLLM's scheduler-side OffloadingManager on
hostkvd's page cache. One hostkv session per scheduler process.

Who holds what (the scheduler never owns a page; each rank's worker owns,
fills and publishes its own shard, see naming.py):
  lookup        Lookup(acquire) in every rank's namespace; the run cached
                on all ranks is the answer. Those pages stay referenced by
                the scheduler's session for hold_seconds (a "hold"), so
                that the prepare_load that follows in the same step finds
                them; an unclaimed hold is released after that.
  prepare_load  claims the hold (or takes references anew) and keeps the
                references until complete_load (vLLM passes it the set of
                a request's loaded hashes; a load vLLM gave up on, which
                never completes, is released after twice its
                load_timeout_seconds): no instance's allocation
                can evict the blocks while workers load them. The spec
                holds the keys; each worker takes its own references.
  touch         not forwarded: the daemon's recency comes from every
                instance's lookups, loads and publishes.
  prepare_store drops the keys every rank has cached already; the workers
                allocate (hostkvd evicts the least recently used
                unreferenced pages for them) and publish. Evicted blocks
                are reported from ListEvictions (every rank's namespace).
  complete_store nothing to commit (the workers published); with KV events
                on, the blocks found on every rank are reported stored.
  take_events   stored (above) and removed (ListEvictions) blocks.
A killed scheduler leaves nothing pinned: its session's references go with
it. Blocks published by another instance of the same layout are hits.
"""
import logging
import time

from vllm.v1.kv_offload.abstract import (OffloadingEvent, OffloadingManager,
                                         PrepareStoreOutput)

from .. import errors
from ..cache_calls import page_list as _page_list
from ..cache_calls import page_runs as _runs
from .keys import KeyMap
from .mediums import HostkvLoadStoreSpec

logger = logging.getLogger("hostkv.vllm")


_denied_logged = []


def _log_denied(error):
    if not _denied_logged:
        _denied_logged.append(True)
        logger.error("hostkv lookups are refused (%s); every lookup misses", error.message)

# Keys per ListEvictions: an answer that fits a command ring slot.
_EVICTIONS_PER_CALL = 2048


class _Hold:
    """References the scheduler's session holds on blocks: per rank the
    pages (in key order) of the first `count` keys."""

    def __init__(self, pages_by_rank, count):
        self.pages_by_rank = pages_by_rank
        self.count = count
        self.since = time.monotonic()


class HostkvOffloadingManager(OffloadingManager):
    def __init__(self, client, layout, block_size, events=False, hold_seconds=5.0,
                 load_timeout_seconds=30.0):
        self._client = client
        self._layout = layout
        self._ranks = [(layout.pool(r), layout.namespace(r)) for r in layout.ranks()]
        self._block_size = block_size  # tokens per offloaded block, for events
        self._events_on = bool(events)
        self._hold_seconds = float(hold_seconds)
        self._keys = KeyMap()
        self._holds = {}  # tuple(keys) -> _Hold, from lookup
        # Loads in flight: [frozenset(keys), _Hold], from prepare_load. vLLM
        # passes complete_load the SET of a request's loaded hashes (its
        # _reqs_being_loaded), in no order.
        self._loading = []
        # A load vLLM gave up on (its load timeout) never gets complete_load:
        # its references go after twice that.
        self._load_expiry = 2 * float(load_timeout_seconds)
        # Keys being stored -> a number growing in prepare_store order:
        # complete_store gets a request's stored hashes as a set, and the
        # check for events needs them in chain order.
        self._store_order = {}
        self._store_seq = 0
        self._events = []
        # ListEvictions' cursor per rank: from now on (0 for a pool not made
        # yet: all of its evictions will be news).
        self._cursors = [self._eviction_cursor(pool, ns) for pool, ns in self._ranks]

    # -- lookups and loads ---------------------------------------------

    def lookup(self, block_hashes):
        self._expire_holds()
        keys = tuple(self._keys.keys(block_hashes))
        if not keys:
            return 0
        self._drop_hold(keys)
        try:
            hold = self._acquire(keys)
        except errors.ResourceExhausted as e:
            # The session's references are capped (--max_cache_refs_per_session):
            # give back every unclaimed hold and try once more; else a miss.
            self._drop_all_holds()
            try:
                hold = self._acquire(keys)
            except errors.HostKVError:
                logger.warning("lookup of %d blocks: %s; answered as a miss", len(keys), e)
                return 0
        except errors.HostKVError as e:
            # hostkvd away longer than reconnect_timeout, or the session lost:
            # a miss, never an exception in vLLM's scheduler.
            logger.warning("lookup of %d blocks: %s %s; answered as a miss", len(keys),
                           e.code_name, e.message)
            return 0
        if hold is None:
            return 0
        if hold.count == 0:
            return 0
        self._holds[keys[:hold.count]] = hold
        return hold.count

    def prepare_load(self, block_hashes):
        keys = tuple(self._keys.keys(block_hashes))
        hold = self._holds.pop(keys, None)
        if hold is None:
            hold = self._acquire(keys)
        if hold is None or hold.count < len(keys):
            if hold is not None:
                self._release(hold)
            found = 0 if hold is None else hold.count
            raise errors.FailedPrecondition(
                f"prepare_load of {len(keys)} blocks: only {found} are cached on every rank "
                "(evicted since lookup)")
        hold.since = time.monotonic()
        self._loading.append([frozenset(keys), hold])
        return HostkvLoadStoreSpec(keys)

    def touch(self, block_hashes):
        return

    def complete_load(self, block_hashes):
        given = frozenset(self._keys.keys(block_hashes))
        # The loads whose blocks are all among them, one per distinct set
        # (vLLM's set may be the union of a request's loads).
        done, seen = [], set()
        for entry in self._loading:
            if entry[0] <= given and entry[0] not in seen:
                seen.add(entry[0])
                done.append(entry)
        if not done:
            logger.warning("complete_load of %d blocks that no prepare_load pinned", len(given))
            return
        for entry in done:
            self._loading.remove(entry)
            self._release(entry[1])

    # -- stores ---------------------------------------------------------

    def prepare_store(self, block_hashes):
        hashes = list(block_hashes)
        keys = self._keys.keys(hashes)
        try:
            cached = self._cached_on_every_rank(keys)
            if cached is None:
                return None  # no worker has registered its KV cache yet
            evicted = self._take_evictions()
        except errors.HostKVError as e:
            logger.warning("prepare_store of %d blocks: %s %s; nothing stored", len(keys),
                           e.code_name, e.message)
            return None
        to_store = hashes[cached:]
        for k in keys[cached:]:
            self._store_seq += 1
            self._store_order[k] = self._store_seq
        parent = keys[cached - 1] if cached > 0 else b""
        return PrepareStoreOutput(block_hashes_to_store=to_store,
                                  store_spec=HostkvLoadStoreSpec(keys[cached:], parent),
                                  block_hashes_evicted=evicted)

    def complete_store(self, block_hashes, success=True):
        # vLLM passes the SET of a request's stored hashes: put them back in
        # the order prepare_store saw them (one prompt's chain).
        hashes = list(block_hashes)
        keys = self._keys.keys(hashes)
        order = [self._store_order.pop(k, float("inf")) for k in keys]
        if not self._events_on or not success or not hashes:
            return
        ranked = sorted(zip(order, keys, hashes), key=lambda t: t[0])
        keys = [k for _, k, _ in ranked]
        # Report what the workers did publish on every rank (a worker that
        # could not allocate reports its job done but stored nothing).
        try:
            stored = self._cached_on_every_rank(keys) or 0
        except errors.HostKVError as e:
            logger.warning("complete_store: %s %s; no event for %d blocks", e.code_name,
                           e.message, len(keys))
            return
        if stored:
            self._events.append(OffloadingEvent([h for _, _, h in ranked][:stored],
                                                self._block_size, "CPU", False))

    def take_events(self):
        if not self._events_on:
            return ()
        try:
            removed = self._take_evictions()
        except errors.HostKVError as e:
            logger.warning("take_events: %s %s; evictions reported later", e.code_name,
                           e.message)
            removed = []
        if removed:
            self._events.append(OffloadingEvent(removed, self._block_size, "CPU", True))
        events, self._events = self._events, []
        return events

    # -- shutdown -------------------------------------------------------

    def close(self):
        """Drops every reference the scheduler holds and closes its session."""
        for hold in list(self._holds.values()):
            self._release(hold)
        self._holds.clear()
        for _, hold in self._loading:
            self._release(hold)
        self._loading.clear()
        self._client.close()

    # -- helpers --------------------------------------------------------

    def _acquire(self, keys):
        """A _Hold on the run of keys cached on every rank (count may be 0,
        holding nothing); None if some rank's pool does not exist yet."""
        found = []
        for pool, namespace in self._ranks:
            try:
                result = self._client.lookup(pool, namespace, list(keys), acquire=True)
            except errors.NotFound:
                self._release(_Hold(found, 0))
                return None
            except errors.PermissionDenied as e:
                # Another user's namespace (its name shared on purpose):
                # misses, never an exception in vLLM's scheduler.
                self._release(_Hold(found, 0))
                _log_denied(e)
                return None
            except BaseException:
                self._release(_Hold(found, 0))  # the ranks before hold references
                raise
            found.append(_page_list(result.pages))
        count = min(len(p) for p in found)
        # Keep the common run; give back what a rank found beyond it.
        for (pool, _), pages in zip(self._ranks, found):
            if len(pages) > count:
                self._client.release(pool, _runs(pages[count:]))
                del pages[count:]
        return _Hold(found, count)

    def _release(self, hold):
        for (pool, _), pages in zip(self._ranks, hold.pages_by_rank):
            if pages:
                try:
                    self._client.release(pool, _runs(pages))
                except errors.HostKVError as e:  # e.g. the daemon restarted
                    logger.warning("releasing %d pages of %s: %s", len(pages), pool, e)

    def _drop_hold(self, keys):
        for k in [k for k in self._holds if k == keys[:len(k)]]:
            self._release(self._holds.pop(k))

    def _drop_all_holds(self):
        for k in list(self._holds):
            self._release(self._holds.pop(k))

    def _expire_holds(self):
        now = time.monotonic()
        for k in [k for k, h in self._holds.items() if now - h.since > self._hold_seconds]:
            self._release(self._holds.pop(k))
        for entry in [e for e in self._loading if now - e[1].since > self._load_expiry]:
            logger.warning("a load of %d blocks was never completed; its references go",
                           len(entry[0]))
            self._loading.remove(entry)
            self._release(entry[1])

    def _cached_on_every_rank(self, keys):
        """The run of keys cached on every rank (no references taken); None
        if some rank's pool does not exist yet."""
        hits = None
        for pool, namespace in self._ranks:
            try:
                n = self._client.lookup(pool, namespace, keys).hits
            except errors.NotFound:
                return None
            except errors.PermissionDenied as e:
                _log_denied(e)
                return None
            hits = n if hits is None else min(hits, n)
        return hits

    def _eviction_cursor(self, pool, namespace):
        try:
            return self._client.list_evictions(pool, namespace, 0, max_keys=0).next
        except errors.NotFound:
            return 0

    def _take_evictions(self):
        """Block hashes evicted on any rank since the last call (each once)."""
        seen, out = set(), []
        for i, (pool, namespace) in enumerate(self._ranks):
            try:
                while True:
                    got = self._client.list_evictions(pool, namespace, self._cursors[i],
                                                      _EVICTIONS_PER_CALL)
                    self._cursors[i] = got.next
                    if got.missed:
                        logger.warning("%d evictions in pool %s left the daemon's log unread",
                                       got.missed, pool)
                    for k in got.keys:
                        if k not in seen:
                            seen.add(k)
                            out.append(self._keys.block_hash(k))
                    if len(got.keys) < _EVICTIONS_PER_CALL:
                        break
            except errors.NotFound:
                continue
        return out
