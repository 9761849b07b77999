"""HostkvStorage: SGLang's HiCache storage tier (HiCacheStorage) on
hostkvd's page cache, loadable by stock SGLang:

    python3 -m sglang.launch_server ... --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "hostkv",
        "module_path": "hostkv.sglang.storage", "class_name": "HostkvStorage",
        "interface_v1": true}'

SGLang's StorageBackendFactory builds it as HostkvStorage(storage_config,
kwargs) and then calls register_mem_pool_host(host_pool); that is when it
connects. Pages are published in hostkvd under SGLang's own page keys
(storage_names.storage_key), each with the page before it in the batch
as its parent (SGLang's batches are prefix-ordered), in one namespace per
interchangeable engine (storage_names.derived_namespace). They outlive the
engine: a restarted engine, or another one on the node, finds them.

The controller's contract, as SGLang's own backends keep it:
batch_exists -> how many keys from the first are stored; batch_get_v1 /
batch_set_v1 -> one bool per key (a prefix of True: the pages that were
loaded / are stored); get -> the filled tensor or None; set / batch_set ->
bool; batch_get -> a list of tensors or None; the v2 calls of hybrid
models (storage_v2.py). Bad input (keys that are no
keys, host indices that are not len(keys) whole pages) raises ValueError
(hostkv.errors.InvalidArgument); the daemon's refusals (pool full, daemon
gone) are logged and answered False / a miss, so SGLang's storage threads
live on.

Extra-config keys (besides SGLang's four): "namespace", "target"
(default $HOSTKV_TARGET, else unix:/run/hostkv/hostkvd.sock),
"auth_token_file" (default $HOSTKV_TOKEN_FILE), "pool_name" and
"pool_tokens" (the hostkvd pool of an in-process host pool; default: named
after the geometry, sized as SGLang's host pool), "client_name".
"""
import logging
import os
import time

from .. import cache_calls, errors
from .. import client as client_module
from . import indices as idx
from . import page_copy, storage_names, storage_paths
from .storage_v2 import HybridPoolCalls

_log = logging.getLogger("hostkv.sglang.storage")
_RECONNECT_INTERVAL = 1.0  # seconds between asks while hostkvd is away

try:  # stock SGLang checks issubclass(backend, HiCacheStorage)
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except ImportError:  # SGLang absent (tests, tools): the same defaults
    class _Base:
        """HiCacheStorage's non-abstract part, for use without SGLang."""

        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host

        def batch_exists(self, keys, extra_info=None):
            for i, key in enumerate(keys):
                if not self.exists(key):
                    return i
            return len(keys)

        def clear(self):
            pass

        def get_stats(self):
            return None


BUFFER_ONLY_RATIO = 8

# SGLang's shm host-pool allocator (--hicache-mem-layout ... shm) exposes its
# pool as a memfd, but makes it with MFD_CLOEXEC only
# (storage/mmap/mmap_allocator.py alloc_shm @13e4fbf9): without
# MFD_ALLOW_SEALING nobody can seal it against shrinking, and hostkvd maps
# only sealed memfds (a peer that truncates a mapped segment would kill the
# daemon with SIGBUS for every user). So pages are copied between that pool
# and hostkvd's, as with any other allocator.
SHM_ALLOCATOR_NOTE = (
    "the engine's host pool is SGLang's shm allocator: its memfd is made without "
    "MFD_ALLOW_SEALING, so hostkvd cannot map it (it maps only memfds sealed against "
    "shrinking); pages are copied between it and hostkvd's pool")


def _host_memory_mode():
    """SGLang's --hicache-host-memory-mode ("cache" or "buffer_only"): not in
    HiCacheStorageConfig; a backend reads it from SGLang's runtime context."""
    try:
        from sglang.srt.runtime_context import \
            get_memory  # pylint: disable=import-outside-toplevel
        return str(getattr(get_memory(), "hicache_host_memory_mode", "cache") or "cache")
    except (ImportError, AttributeError):
        return "cache"


def _read_token(path):
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


class HostkvStorage(HybridPoolCalls, _Base):
    """One engine rank's storage tier on hostkvd. Thread-safe (SGLang's
    prefetch, prefetch I/O and backup threads call it at once): the state
    after register_mem_pool_host is read-only and hostkv.Client is."""

    def __init__(self, storage_config=None, kwargs=None, **options):
        self.storage_config = storage_config
        config = dict(getattr(storage_config, "extra_config", None) or {})
        config.update(kwargs or {})
        config.update(options)
        self.config = config
        self.mem_pool_host = None
        self.namespace = None
        self._path = None
        self._last_contact = 0.0  # while hostkvd is away: when it was last asked

    # -- setup ---------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        """Connects: picks the path for `mem_pool_host` (SGLang's in-process
        host pool or hostkv's remote one) and fixes the namespace."""
        super().register_mem_pool_host(mem_pool_host)
        c = self.config
        if c.get("namespace"):
            self.namespace = storage_names.check_namespace(c["namespace"])
        else:
            self.namespace = storage_names.derived_namespace(self.storage_config,
                                                             mem_pool_host.page_size)
        target = (c.get("target") or os.environ.get("HOSTKV_TARGET")
                  or client_module.DEFAULT_TARGET)
        token = _read_token(c.get("auth_token_file") or os.environ.get("HOSTKV_TOKEN_FILE"))
        rank = getattr(self.storage_config, "tp_rank", 0)
        name = c.get("client_name") or f"sglang-storage-{os.getpid()}-tp{rank}"
        pool_tokens = c.get("pool_tokens")
        if pool_tokens is None and _host_memory_mode() == "buffer_only":
            # The engine's host pool is only a staging buffer then: sized
            # like it, the node cache could hold no more than the buffer.
            ratio = float(c.get("buffer_only_ratio", BUFFER_ONLY_RATIO))
            pool_tokens = int(mem_pool_host.size * ratio)
            _log.info("hicache host memory mode buffer_only: the engine's host pool (%d "
                      "tokens) stages pages; hostkvd's pool gets %d tokens (buffer_only_ratio "
                      "%g; pool_tokens sets it exactly)", mem_pool_host.size, pool_tokens,
                      ratio)
        if self._path is not None:
            self._path.close()
        self._path = storage_paths.path_for(mem_pool_host, target, name, token,
                                            c.get("pool_name"), pool_tokens)
        _log.info("hostkv storage: namespace %s, hostkvd pool %s (%s)", self.namespace,
                  self._path.pool_name, type(self._path).__name__)
        if getattr(getattr(mem_pool_host, "allocator", None), "fds", None):
            _log.info(SHM_ALLOCATOR_NOTE)

    def close(self):
        """Ends the storage's own session (an in-process host pool's path);
        the cached pages stay in hostkvd."""
        if self._path is not None:
            self._path.close()
            self._path = None

    @property
    def pool_name(self):
        """The hostkvd pool the cached pages are in."""
        return self._ready().pool_name

    @property
    def client(self):
        """The session the storage calls hostkvd with."""
        return self._ready().client

    def _ready(self):
        if self._path is None:
            raise errors.FailedPrecondition(
                "HostkvStorage: register_mem_pool_host was not called")
        return self._path

    def _live(self):
        """The path while hostkvd answers, else None: the caller answers
        misses (a storage tier never fails the engine). A path of its own
        whose session hostkvd lost (a daemon restarted without its state) is
        opened again, the pool created again if need be; asked at most once
        a second while the daemon is away."""
        path = self._ready()
        client = path.client
        if client.session_lost is None and not client.daemon_away:
            return path
        now = time.monotonic()
        if now - self._last_contact < _RECONNECT_INTERVAL:
            return None
        self._last_contact = now
        if client.session_lost is None:
            try:
                return path if client.probe() else None
            except errors.SessionLost:
                pass
        if not isinstance(path, storage_paths.LocalPoolPath):
            return None  # the host pool's session: the host pool reports its loss
        try:
            fresh = path.reopen()
        except errors.HostKVError as e:
            _log.warning("hostkv storage: reconnecting failed: %s %s", e.code_name,
                         e.message)
            return None
        self._path = fresh
        try:
            path.close()
        except errors.HostKVError:
            pass
        _log.warning("hostkv storage: reconnected to hostkvd (session %d, pool %s)",
                     fresh.client.session_number, fresh.pool_name)
        return fresh

    def _engine_pages(self, keys, host_indices):
        """The host pool's page numbers of `host_indices`, one per key."""
        pages = idx.pages_of(host_indices, self.mem_pool_host.page_size,
                             self.mem_pool_host.size).tolist()
        if len(pages) != len(keys):
            raise errors.InvalidArgument(
                f"{len(keys)} keys but host indices for {len(pages)} pages")
        return pages

    # -- existence -------------------------------------------------------------

    def batch_exists(self, keys, extra_info=None):
        """How many keys, from the first, are stored (0 if hostkvd refuses
        or is away)."""
        keys = [storage_names.storage_key(k) for k in keys]
        path = self._live()
        if not keys or path is None:
            return 0
        try:
            return path.client.lookup(path.pool_name, self.namespace, keys).hits
        except errors.HostKVError as e:
            _log.warning("hostkv storage: lookup failed: %s %s", e.code_name, e.message)
            return 0

    def exists(self, key):
        return self.batch_exists([key]) == 1

    # -- zero copy (interface_v1) ------------------------------------------------

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Loads the stored prefix of `keys` into the host pool's pages at
        `host_indices` (len(keys) whole pages); one bool per key."""
        path = self._live()
        if path is None:
            return [False] * len(keys)
        cache_keys = [storage_names.storage_key(k) for k in keys]
        pages = self._engine_pages(keys, host_indices)
        hits = self._load(path, cache_keys, lambda cached, n: path.load(cached, pages[:n]))
        return [True] * hits + [False] * (len(keys) - hits)

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Stores the host pool's pages at `host_indices` under `keys`; one
        bool per key (True: stored now or already)."""
        path = self._live()
        if path is None:
            return [False] * len(keys)
        cache_keys = [storage_names.storage_key(k) for k in keys]
        pages = self._engine_pages(keys, host_indices)
        stored = self._store(path, cache_keys, _first_parent(extra_info),
                             lambda first: path.store(pages[first:]))
        return [True] * stored + [False] * (len(keys) - stored)

    # -- flat pages (SGLang's generic path) ----------------------------------------

    def get(self, key, target_location=None, target_sizes=None):
        """The page stored under `key` into `target_location` (a flat page,
        get_dummy_flat_data_page's shape; a new one if None), or None."""
        got = self.batch_get([key], None if target_location is None else [target_location])
        return got[0]

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Per key the filled flat page, None from the first key not stored."""
        path = self._live()
        if path is None:
            return [None] * len(keys)
        kv = self._flat_buffer(path)
        cache_keys = [storage_names.storage_key(k) for k in keys]
        targets = list(target_locations or [None] * len(keys))
        if len(targets) != len(keys):
            raise errors.InvalidArgument(f"{len(keys)} keys but {len(targets)} targets")

        def fill(cached, n):
            for i, page in enumerate(cache_calls.page_list(cached)[:n]):
                view = self._page(kv, path, page)
                if targets[i] is None:
                    targets[i] = view.flatten().clone()
                else:
                    _check_flat(targets[i], view)
                    targets[i].view(-1).copy_(view.reshape(-1))

        hits = self._load(path, cache_keys, fill)
        return targets[:hits] + [None] * (len(keys) - hits)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value])

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Stores flat pages (get_data_page(flat=True)) under `keys`; True
        if every key is stored."""
        path = self._live()
        if path is None:
            return False
        kv = self._flat_buffer(path)
        cache_keys = [storage_names.storage_key(k) for k in keys]
        values = list(values or [])
        if len(values) != len(keys) or any(v is None for v in values):
            raise errors.InvalidArgument(f"{len(keys)} keys need {len(keys)} flat pages")

        def write(first):
            runs = path.client.alloc(path.pool_name, (len(keys) - first) * path.page_size)
            try:
                for value, page in zip(values[first:], cache_calls.page_list(runs)):
                    view = self._page(kv, path, page)
                    _check_flat(value, view)
                    view.copy_(value.to(device="cpu", dtype=view.dtype).reshape(view.shape))
            except BaseException:
                path.client.free(path.pool_name, runs)
                raise
            return runs

        return self._store(path, cache_keys, None, write) == len(keys)

    def _flat_buffer(self, path):
        if path.kv is None:
            raise errors.FailedPrecondition(
                "HostkvStorage: flat pages need the pool mapped (a unix: target); "
                "use interface_v1")
        return path.kv

    @staticmethod
    def _page(kv, path, page):
        return page_copy.page_view(kv, path.layout, path.mha, page * path.page_size,
                                   path.page_size)

    # -- the two moves -------------------------------------------------------------

    def _load(self, path, keys, copy):
        """Looks `keys` up with references, calls copy(cached_runs, hits),
        releases; returns the hits (0 when hostkvd refuses)."""
        if not keys:
            return 0
        try:
            hits, cached = path.client.lookup(path.pool_name, self.namespace, keys,
                                              acquire=True)
        except errors.HostKVError as e:
            _log.warning("hostkv storage: lookup failed: %s %s", e.code_name, e.message)
            return 0
        try:
            if hits:
                copy(cached, hits)
        except errors.HostKVError as e:
            _log.warning("hostkv storage: loading %d pages failed: %s %s", hits,
                         e.code_name, e.message)
            hits = 0
        finally:
            if cached:
                try:
                    path.client.release(path.pool_name, cached)
                except errors.HostKVError as e:
                    _log.warning("hostkv storage: release failed: %s", e.message)
        return hits

    def _store(self, path, keys, first_parent, write):
        """Publishes the keys not stored yet: those after the stored prefix
        get pages from write(first) -> runs (the copies), parents chained
        through the batch. Returns how many keys, from the first, are
        stored (the prefix on a refusal)."""
        if not keys:
            return 0
        client = path.client
        try:
            first = client.lookup(path.pool_name, self.namespace, keys).hits
        except errors.HostKVError as e:
            _log.warning("hostkv storage: lookup failed: %s %s", e.code_name, e.message)
            return 0
        if first == len(keys):
            return first
        try:
            runs = write(first)
        except errors.HostKVError as e:
            _log.warning("hostkv storage: no pages for %d keys: %s %s", len(keys) - first,
                         e.code_name, e.message)
            return first
        parents = [keys[i - 1] if i > 0 else first_parent for i in range(first, len(keys))]
        try:
            done = client.publish(path.pool_name, self.namespace, keys[first:], runs,
                                  parent_keys=parents)
        except errors.HostKVError as e:
            _log.warning("hostkv storage: publish failed: %s %s", e.code_name, e.message)
            _free_quietly(client, path.pool_name, runs)
            return first
        if done.uncached_pages:  # stored meanwhile by another engine: ours go back
            _free_quietly(client, path.pool_name, done.uncached_pages)
        return len(keys)

    def clear(self):
        """Nothing: hostkvd's cache is the node's (other engines use it), and
        it evicts by itself when its pool needs the pages."""
        _log.info("hostkv storage: clear() leaves hostkvd's page cache as it is")

    def get_stats(self):
        return None  # SGLang's StorageMetrics: no per-call bandwidth kept


def _first_parent(extra_info):
    """The key of the page before the batch (SGLang's prefix_keys), or None."""
    prefix = getattr(extra_info, "prefix_keys", None)
    return storage_names.storage_key(prefix[-1], "prefix key") if prefix else None


def _check_flat(tensor, view):
    if tensor.numel() != view.numel():
        raise errors.InvalidArgument(
            f"a flat page has {view.numel()} elements, not {tensor.numel()}")


def _free_quietly(client, pool, runs):
    try:
        client.free(pool, runs)
    except errors.HostKVError as e:
        _log.warning("hostkv storage: freeing %s failed: %s", runs, e.message)
