"""HostkvLinker's offloads: a session and a thread of their own, so that
SGLang's scheduler thread (which calls offload()) never waits for a copy or
for the daemon. Each offload: Alloc of its pages (hostkvd evicts the
coldest unreferenced cached pages for it), a Backup of its device slots
(on CUDA after the stream's KV-written mark taken when offload() was
called), a wait, and a Publish under SGLang's page hashes (a hash another
engine published meanwhile keeps that page; ours is freed). The result,
True when every page is cached (ours or another engine's), False when
nothing could be stored (a full pool of referenced pages, hostkvd away,
the session lost), is reported in offload() order, as SGLang's wrapper
pairs them with its pending offloads.
"""
import collections
import logging
import queue
import threading

from .. import errors
from .._pace import Pace
from ..cache_calls import page_runs

logger = logging.getLogger("hostkv.sglang")

RECONNECT_SECONDS = 5.0


class OffloadQueue:
    def __init__(self, connect, place, kv, register):
        self._connect = connect
        self._place = place
        self._kv = kv
        self._register = register
        self._client = connect()
        try:
            self._import_id, self._sync = register(self._client)
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

    def put(self, keys, device_indices):
        """Queues one offload; True (its result comes later). A CUDA index
        tensor reaches the host by a copy on the current stream that the
        offload thread waits for."""
        slots = self._sync.host_indices(device_indices)
        mark = self._sync.mark_kv_written()
        with self._lock:
            self._in_flight += 1
        self._work.put((keys, slots, mark))
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
            item = self._work.get()
            if item is None:
                return
            keys, slots, mark = item
            try:
                ok = self._offload(keys, slots, mark)
            except Exception:  # pylint: disable=broad-except
                logger.exception("offload of %d pages", len(keys))
                ok = False
            with self._idle:
                self._results.append(ok)
                self._in_flight -= 1
                self._idle.notify_all()

    def _offload(self, keys, slots, mark):
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
        ps = self._kv.page_size
        slots = [int(s) for s in slots.get().tolist()]
        if len(slots) != len(keys) * ps:
            logger.error("offload: %d device slots for %d pages of %d", len(slots), len(keys),
                         ps)
            return False
        pool = self._place.pool
        try:
            pages = c.alloc(pool, len(keys) * ps, wait=False)
        except errors.HostKVError as e:
            logger.warning("offload of %d pages: %s %s; not stored", len(keys), e.code_name,
                           e.message)
            return False
        try:
            op = c.backup(pool, self._import_id, pages, page_runs(slots),
                          wait_kv_written=mark)
            c.wait(op)
            published = c.publish(pool, self._place.namespace, keys, pages)
        except errors.HostKVError as e:
            logger.warning("offload of %d pages: %s %s; not stored", len(keys), e.code_name,
                           e.message)
            self._free(pages)
            return False
        if published.uncached_pages:  # another engine's pages are cached already
            self._free(published.uncached_pages)
        return True

    def _free(self, pages):
        try:
            self._client.free(self._place.pool, pages)
        except errors.HostKVError as e:
            logger.warning("freeing %d page runs: %s", len(pages), e)

    def _reconnect(self):
        if not self._reconnects.due():
            return
        try:
            client = self._connect()
            try:
                import_id, sync = self._register(client)
            except BaseException:
                client.close()
                raise
        except errors.HostKVError as e:
            logger.warning("no new hostkv session for offloads yet: %s", e)
            return
        old, self._client = self._client, client
        self._import_id, self._sync = import_id, sync
        old.close()
