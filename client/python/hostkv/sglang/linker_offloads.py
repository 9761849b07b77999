"""HostkvLinker's offloads: a session and a thread of their own, so that
SGLang's scheduler thread (which calls offload()) never waits for a copy or
for the daemon. Each offload: Alloc of its pages (hostkvd evicts the
coldest unreferenced cached pages for it), a Backup of its device slots
(on CUDA after the stream's KV-written mark taken when offload() was
called), a wait, and a Publish under SGLang's page hashes (a hash another
engine published meanwhile keeps that page; ours is freed). An offload
of a sliding-window model carries the window's pages too (their own pool):
they are published before the KV pages, so a lookup that finds the KV
finds the window. The result, True when every page is cached (ours or
another engine's), False when not all could be stored (a full pool of
referenced pages, hostkvd away, the session lost), is reported in
offload() order, as SGLang's wrapper pairs them with its pending offloads.
"""
import collections
import logging
import queue
import threading

from .. import errors
from .._pace import Pace
from ..cache_calls import page_runs
from .linker_parts import KV, register_all

logger = logging.getLogger("hostkv.sglang")

RECONNECT_SECONDS = 5.0


class OffloadQueue:
    def __init__(self, connect, parts):
        self._connect = connect
        self._parts = parts
        self._client = connect()
        try:
            self._imports = register_all(parts, self._client)
        except BaseException:
            self._client.close()
            raise
        self._work = queue.Queue()
        self._results = collections.deque()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._reconnects = Pace(RECONNECT_SECONDS)
        self._idle = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._run, name="hostkv-linker-offload",
                                        daemon=True)
        self._thread.start()

    def put(self, parts):
        """Queues one offload of [(part name, page keys, device indices)];
        True (its result comes later). A CUDA index tensor reaches the host
        by a copy on the current stream that the offload thread waits for."""
        work = []
        for name, keys, device_indices in parts:
            sync = self._imports[name].sync
            work.append((name, keys, sync.host_indices(device_indices), sync.mark_kv_written()))
        with self._lock:
            self._in_flight += 1
        self._work.put(work)
        return True

    def completed(self):
        with self._lock:
            return len(self._results)

    def pop(self):
        with self._lock:
            return self._results.popleft()

    def drain(self):
        """Returns once every offload queued so far has its result."""
        with self._idle:
            while self._in_flight:
                self._idle.wait()

    def reset(self):
        """SGLang's reset: waits for what was queued and forgets its results
        (SGLang forgets those offloads; a result kept would pair with the
        next offload)."""
        self.drain()
        with self._lock:
            self._results.clear()

    def close(self):
        self.drain()
        self._work.put(None)
        self._thread.join()
        self._client.close()

    def _run(self):
        while True:
            work = self._work.get()
            if work is None:
                return
            try:
                ok = self._offload(work)
            except Exception:  # pylint: disable=broad-except
                logger.exception("offload of %d pages", sum(len(k) for _, k, _, _ in work))
                ok = False
            with self._idle:
                self._results.append(ok)
                self._in_flight -= 1
                self._idle.notify_all()

    def _offload(self, work):
        c = self._client
        if c.session_lost:
            self._reconnect()
            c = self._client
        if c.daemon_away:
            try:
                if not c.probe():
                    return False  # offloads are optional: never wait for the daemon
            except errors.SessionLost:
                self._reconnect()
                return False
        ps = self._parts[KV].kv.page_size
        copies = []  # (name, keys, pages, operation)
        try:
            for name, keys, slots, mark in work:
                slots = [int(s) for s in slots.get().tolist()]
                if len(slots) != len(keys) * ps:
                    logger.error("offload: %d %s device slots for %d pages of %d",
                                 len(slots), name, len(keys), ps)
                    return False
                pool = self._parts[name].place.pool
                pages = c.alloc(pool, len(keys) * ps, wait=False)
                copies.append([name, keys, pages, None])
                copies[-1][3] = c.backup(pool, self._imports[name].import_id, pages,
                                         page_runs(slots), wait_kv_written=mark)
            for _, _, _, op in copies:
                c.wait(op)
            # The window's pages first: a lookup that finds the KV finds them.
            for copy in sorted(copies, key=lambda cp: cp[0] == KV):
                name, keys, pages, _ = copy
                place = self._parts[name].place
                published = c.publish(place.pool, place.namespace, keys, pages)
                copy[2] = []  # published: the cache's now
                if published.uncached_pages:  # another engine's pages are cached already
                    self._free(name, published.uncached_pages)
        except errors.HostKVError as e:
            logger.warning("offload of %d pages: %s %s; not stored",
                           sum(len(k) for _, k, _, _ in work), e.code_name, e.message)
            for name, _, pages, _ in copies:
                self._free(name, pages)
            return False
        return True

    def _free(self, name, pages):
        if not pages:
            return
        try:
            self._client.free(self._parts[name].place.pool, pages)
        except errors.HostKVError as e:
            logger.warning("freeing %d page runs: %s", len(pages), e)

    def _reconnect(self):
        if not self._reconnects.due():
            return
        try:
            client = self._connect()
            try:
                imports = register_all(self._parts, client)
            except BaseException:
                client.close()
                raise
        except errors.HostKVError as e:
            logger.warning("no new hostkv session for offloads yet: %s", e)
            return
        old, self._client, self._imports = self._client, client, imports
        old.close()
