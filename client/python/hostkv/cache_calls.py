"""The page cache calls of hostkv.Client (Publish, Lookup, Release, CopyPages).

    pages = c.alloc("llama", 4 * 16)                  # 4 pages of 16 tokens
    ...                                               # fill them (backup, mapping)
    done = c.publish("llama", "llama-3-8b/tp0-1", keys, pages)
    c.free("llama", done.uncached_pages)              # keys cached already: still ours
    hits, cached = c.lookup("llama", "llama-3-8b/tp0-1", keys, acquire=True)
    c.copy_pages("llama", cached, my_pages[:hits])    # or load them to the device
    c.release("llama", cached)

Keys are bytes of 1..64 (a str is taken as its utf-8 bytes); pages go in
and come back as runs [(first_page, num_pages), ...], as alloc and free
take them. A published page is the cache's (immutable, no session's); a
lookup with acquire gives this session a reference per page found, which
keeps it from eviction until release (or the session's end). Errors raise
the hostkv.errors class of the daemon's code; a malformed key raises
InvalidArgument before anything is sent.
"""
import dataclasses
import logging
import threading
from typing import List, NamedTuple, Tuple

from . import errors
from ._proto import hostkv_pb2 as pb

MAX_KEY_BYTES = 64

CACHED = pb.PUBLISH_CACHED
ALREADY_CACHED = pb.PUBLISH_ALREADY_CACHED
CONFLICT = pb.PUBLISH_CONFLICT


def cache_key(key, what="key"):
    """`key` as the bytes the daemon stores: bytes as given, str as utf-8.

    InvalidArgument unless 1..64 bytes, or for another type.
    """
    if isinstance(key, str):
        key = key.encode("utf-8")
    elif isinstance(key, (bytearray, memoryview)):
        key = bytes(key)
    elif not isinstance(key, bytes):
        raise errors.InvalidArgument(f"a {what} is bytes or str, not {type(key).__name__}")
    if not 1 <= len(key) <= MAX_KEY_BYTES:
        raise errors.InvalidArgument(
            f"a {what} has 1..{MAX_KEY_BYTES} bytes, not {len(key)}")
    return key


def page_list(runs):
    """The page numbers of runs [(first, count), ...], in order."""
    pages = []
    for first, count in runs:
        pages.extend(range(first, first + count))
    return pages


def page_runs(pages):
    """Run-length encodes page numbers in order: [(first, count), ...]."""
    runs = []
    for page in pages:
        if runs and runs[-1][0] + runs[-1][1] == page:
            runs[-1][1] += 1
        else:
            runs.append([page, 1])
    return [(first, count) for first, count in runs]


@dataclasses.dataclass(frozen=True)
class Published:
    """What Publish did, item by item (PublishResponse).

    outcomes[i]: CACHED (the item's page is now the cache's), ALREADY_CACHED
    (the key had a page already: that one is kept, the item's page stays
    the caller's) or CONFLICT (the page was cached by an earlier item of the
    same call). pages[i]: the page cached under key i now.
    """
    outcomes: List[int]
    pages: List[int]
    cached: int
    already_cached: int
    # The caller's pages the cache did not take (ALREADY_CACHED items), as
    # runs: still the caller's, to free or to reuse.
    uncached_pages: List[Tuple[int, int]]


class Lookup(NamedTuple):
    """Lookup's answer: how many keys from the first are cached, and their
    pages (one per hit, in key order) as runs."""
    hits: int
    pages: List[Tuple[int, int]]


class Evictions(NamedTuple):
    keys: list
    next: int
    missed: int


class HeldReferences:
    """The references a session holds on cached pages, with the key each
    page is cached under: a daemon restart drops them (its ledger keeps
    keys, not references), and the resume takes them again where the key
    is still cached on the same page. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._held = {}  # (pool, page) -> [namespace, key, count]

    def add(self, pool, namespace, keys, pages):
        with self._lock:
            for key, page in zip(keys, pages):
                entry = self._held.setdefault((pool, page), [namespace, key, 0])
                entry[2] += 1

    def drop(self, pool, pages):
        with self._lock:
            for page in pages:
                entry = self._held.get((pool, page))
                if entry is None:
                    continue
                entry[2] -= 1
                if entry[2] <= 0:
                    del self._held[(pool, page)]

    def forget(self, pool, page):
        with self._lock:
            self._held.pop((pool, page), None)

    def items(self):
        with self._lock:
            return [(pool, page, ns, key, n) for (pool, page), (ns, key, n) in
                    self._held.items()]


class CacheCalls:
    """The page cache's calls, mixed into hostkv.Client (which gives
    _call, _stub, session_id and _held, a HeldReferences)."""

    def publish(self, pool, namespace, keys, pages, parent_keys=None, acquire=False):
        """Publishes `pages` (runs of this session's pages, one page per key,
        in key order) under `keys` in `namespace`; returns Published.

        parent_keys: None, or one per key (None or b"" for none): the key of
        the page before this one, evicted only after its cached children.
        acquire: also take a reference on the page cached under each key.
        FailedPrecondition for a page this session does not own (or one
        cached already); PermissionDenied for another user's namespace;
        InvalidArgument for a malformed key or namespace, or a page count
        other than the key count. All or nothing on bad input.
        """
        keys = [cache_key(k) for k in keys]
        own = page_list(pages)
        if len(own) != len(keys):
            raise errors.InvalidArgument(f"{len(keys)} keys but {len(own)} pages")
        if parent_keys is None:
            parents = [b""] * len(keys)
        else:
            parents = [b"" if p is None or p in (b"", "") else cache_key(p, "parent key")
                       for p in parent_keys]
            if len(parents) != len(keys):
                raise errors.InvalidArgument(
                    f"{len(keys)} keys but {len(parents)} parent keys")
        # One prompt's pages in order (each parent the key before): sent
        # chained, every key once.
        chained = len(keys) > 1 and parents[1:] == keys[:-1]
        if chained:
            parents = parents[:1] + [b""] * (len(keys) - 1)
        response = self._call(self._stub.Publish, pb.PublishRequest(
            session_id=self.session_id, pool=pool, namespace=namespace,
            items=[pb.CacheItem(key=k, parent_key=p, page=page)
                   for k, p, page in zip(keys, parents, own)],
            acquire=acquire, chained=chained))
        results = list(response.results)
        if len(results) != len(keys):
            raise errors.Internal(
                f"Publish answered {len(results)} results for {len(keys)} items")
        outcomes = [r.outcome for r in results]
        if acquire:
            held = [(k, r.page) for k, r in zip(keys, results) if r.outcome != CONFLICT]
            self._held.add(pool, namespace, [k for k, _ in held], [p for _, p in held])
        return Published(
            outcomes=outcomes, pages=[r.page for r in results], cached=response.cached,
            already_cached=response.already_cached,
            uncached_pages=page_runs([page for page, outcome in zip(own, outcomes)
                                      if outcome == ALREADY_CACHED]))

    def lookup(self, pool, namespace, keys, acquire=False, wait=True):
        """The longest cached prefix of `keys` in `namespace`: Lookup(hits,
        pages). With acquire the session takes a reference on each page
        found (release them); without, the pages may be evicted at once.
        PermissionDenied for another user's namespace. wait=False:
        Unavailable at once if hostkvd does not answer (a scheduler thread
        that must not wait for a restarting daemon).
        """
        keys = [cache_key(k) for k in keys]
        response = self._call(self._stub.Lookup, pb.LookupRequest(
            session_id=self.session_id, pool=pool, namespace=namespace, keys=keys,
            acquire=acquire), wait)
        pages = [(r.first_page, r.num_pages) for r in response.pages]
        if sum(n for _, n in pages) != response.hits:
            raise errors.Internal(
                f"Lookup answered {response.hits} hits but pages for "
                f"{sum(n for _, n in pages)}")
        if acquire and response.hits:
            self._held.add(pool, namespace, keys[:response.hits], page_list(pages))
        return Lookup(response.hits, pages)

    def release(self, pool, pages, wait=True):
        """Drops one of this session's references per page of `pages` (runs;
        a page listed twice drops two). All or nothing: FailedPrecondition
        for a page the session holds no (or too few) references on. Returns
        how many were released. wait=False: Unavailable at once if hostkvd
        does not answer."""
        released = self._call(self._stub.Release, pb.ReleaseRequest(
            session_id=self.session_id, pool=pool,
            pages=[pb.PageRun(first_page=f, num_pages=n) for f, n in pages]), wait).released
        self._held.drop(pool, page_list(pages))
        return released

    def _take_references_again(self):
        """After a resume: each reference held before the restart taken
        again on its page, where that page is still cached under its key;
        one whose key moved or went is dropped (a Load or Release naming
        that page then fails as it should). Returns (taken, dropped)."""
        taken = dropped = 0
        for pool, page, namespace, key, count in self._held.items():
            self._held.forget(pool, page)
            for _ in range(count):
                try:
                    response = self._call_once(self._stub.Lookup, pb.LookupRequest(
                        session_id=self.session_id, pool=pool, namespace=namespace,
                        keys=[key], acquire=True))
                except (errors.Unavailable, errors.Cancelled):
                    raise
                except errors.HostKVError:
                    dropped += count
                    break
                found = page_list([(r.first_page, r.num_pages) for r in response.pages])
                if found == [page]:
                    self._held.add(pool, namespace, [key], [page])
                    taken += 1
                    continue
                if found:  # cached again elsewhere: not the page the caller holds
                    self._call_once(self._stub.Release, pb.ReleaseRequest(
                        session_id=self.session_id, pool=pool,
                        pages=[pb.PageRun(first_page=found[0], num_pages=1)]))
                dropped += count
                break
        if dropped:
            logging.getLogger("hostkv").warning(
                "hostkv: %d references on cached pages could not be taken again after "
                "the restart (their keys were evicted meanwhile)", dropped)
        return taken, dropped

    def list_evictions(self, pool, namespace, after=0, max_keys=2048):
        """Keys of `namespace` the cache evicted after eviction number
        `after`: Evictions(keys, next, missed). Pass `next` as `after` next
        time; max_keys=0 gives no keys and the current `next` (start "from
        now"). missed > 0: evictions (of any namespace) left the daemon's
        log before they were read, so some of this namespace's may be lost.
        Up to 2,048 keys go through the command ring; more, over gRPC.
        """
        response = self._call(self._stub.ListEvictions, pb.ListEvictionsRequest(
            session_id=self.session_id, pool=pool, namespace=namespace, after=after,
            max_keys=max_keys))
        return Evictions(list(response.keys), response.next, response.missed)

    def explain_misses(self, pool, namespace, keys=(), max_recent=10):
        """Why lookups of `namespace` miss (`hostkv why`): the
        ExplainMissesResponse: keys (each cached now, or its reason:
        NEVER_PUBLISHED, EVICTED with evicted_seconds_ago and
        evicted_for_session, OTHER_NAMESPACE with other_namespace,
        REFUSED), recent (the namespace's latest misses, newest first),
        lookups (its MissCounters) and hint (set when its lookups and
        publishes never meet). Access as Lookup."""
        return self._call(self._stub.ExplainMisses, pb.ExplainMissesRequest(
            session_id=self.session_id, pool=pool, namespace=namespace,
            keys=[cache_key(k) for k in keys], max_recent=max_recent))

    def copy_pages(self, pool, from_pages, to_pages):
        """Copies page i of `from_pages` into page i of `to_pages` inside the
        daemon (every layer, the pool's layout); returns the pages copied
        once the bytes are there. from_pages: cached pages this session
        references, or pages it owns; to_pages: pages it owns. Equal totals,
        no page twice, no overlap, else InvalidArgument / FailedPrecondition.
        """
        return self._call(self._stub.CopyPages, pb.CopyPagesRequest(
            session_id=self.session_id, pool=pool,
            from_pages=[pb.PageRun(first_page=f, num_pages=n) for f, n in from_pages],
            to_pages=[pb.PageRun(first_page=f, num_pages=n) for f, n in to_pages])).pages
