"""HostkvStorage's v2 calls: SGLang's hybrid models (hicache_storage.py and
the hybrid cache controller at 001067ff / 00343773) register every host
pool with register_mem_host_pool_v2(host_pool, PoolName) and move pages of
several pools per call with PoolTransfer lists:

- batch_exists_v2(keys, pool_transfers, extra_info) -> PoolTransferResult:
  kv_hit_pages is the KV hits already cut down to what every pool has
  (ALL_PAGES: each page up to there; TRAILING_PAGES: the last len(keys)
  pages before it), extra_pool_hit_pages per pool;
- batch_get_v2 / batch_set_v2(transfers, extra_info) -> {pool: [bool per
  key]}, every key of every transfer tried, nothing raised for a refusal.

The KV pool's pages go the v1 way (batch_get_v1 / batch_set_v1); the
others through storage_side_pools.SidePool.
"""
import logging

from . import storage_names
from .storage_side_pools import SidePool, side_pool_name

_log = logging.getLogger("hostkv.sglang.storage")
_KV = "kv"

try:  # SGLang's own result type, where SGLang is importable
    from sglang.srt.mem_cache.hicache_storage import PoolTransferResult
except ImportError:
    class PoolTransferResult:  # the same two fields
        def __init__(self, kv_hit_pages, extra_pool_hit_pages):
            self.kv_hit_pages = kv_hit_pages
            self.extra_pool_hit_pages = extra_pool_hit_pages


def _name(pool):
    """A PoolName (a str enum) or a str, as its value."""
    return str(getattr(pool, "value", pool))


class HybridPoolCalls:
    """The v2 half of HostkvStorage (which provides _ready, _load, _store,
    namespace, batch_exists, batch_get_v1, batch_set_v1)."""

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """Registers one of a hybrid model's host pools: the KV pool as
        register_mem_pool_host does, the others as SidePools."""
        name = _name(host_pool_name)
        pools = self.__dict__.setdefault("registered_pools", {})
        pools[host_pool_name] = host_pool
        if name == _KV:
            if self._path is None or self.mem_pool_host is not host_pool:
                self.register_mem_pool_host(host_pool)
            return
        path = self._ready()
        sides = self.__dict__.setdefault("_side_pools", {})
        sides[name] = SidePool(path.client, host_pool, side_pool_name(path.pool_name, name))
        _log.info("hostkv storage: pool %s in hostkvd pool %s", name,
                  sides[name].pool_name)

    def _side(self, pool):
        side = self.__dict__.get("_side_pools", {}).get(_name(pool))
        if side is None:
            _log.warning("hostkv storage: pool %s was not registered "
                         "(register_mem_host_pool_v2): its pages are misses", _name(pool))
        return side

    def _present(self, side, keys):
        """How many of `keys`, from the first, `side` has cached."""
        if side is None or not keys:
            return 0
        try:
            return side.client.lookup(side.pool_name, self.namespace, keys).hits
        except Exception as e:  # pylint: disable=broad-except
            _log.warning("hostkv storage: lookup in %s failed: %s", side.pool_name, e)
            return 0

    def _boundary(self, side, transfer, keys, kv_pages):
        cache_keys = [storage_names.storage_key(k) for k in keys[:kv_pages]]
        if _name(getattr(transfer, "hit_policy", "all_pages")) == "trailing_pages":
            window = max(1, len(transfer.keys) if transfer.keys else 1)
            for end in range(kv_pages, 0, -1):
                start = max(0, end - window)
                if self._present(side, cache_keys[start:end]) == end - start:
                    return end
            return 0
        return self._present(side, cache_keys)

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        kv_pages = self.batch_exists(keys, extra_info)
        hits = {_KV: kv_pages} if kv_pages else {}
        final = kv_pages
        for transfer in pool_transfers or []:
            if final == 0:
                break
            if _name(transfer.name) == _KV:
                continue
            boundary = self._boundary(self._side(transfer.name), transfer, list(keys), final)
            if boundary:
                hits[transfer.name] = boundary
            final = min(final, boundary)
        return PoolTransferResult(final, hits)

    def batch_get_v2(self, transfers, extra_info=None):
        return {t.name: self._move_v2(t, extra_info, load=True) for t in transfers}

    def batch_set_v2(self, transfers, extra_info=None):
        return {t.name: self._move_v2(t, extra_info, load=False) for t in transfers}

    def _move_v2(self, transfer, extra_info, load):
        """One transfer's bools; a failure is logged and answered False
        (an exception would end SGLang's storage thread)."""
        keys = list(transfer.keys or [])
        try:
            return self._move_pool(transfer, keys, extra_info, load)
        except Exception as e:  # pylint: disable=broad-except
            _log.warning("hostkv storage: %s of %d pages of pool %s failed: %s",
                         "get" if load else "set", len(keys), _name(transfer.name), e)
            return [False] * len(keys)

    def _move_pool(self, transfer, keys, extra_info, load):
        if _name(transfer.name) == _KV:
            call = self.batch_get_v1 if load else self.batch_set_v1
            return call(keys, transfer.host_indices, extra_info)
        side = self._side(transfer.name)
        starts = self._side_pages(side, transfer, keys)
        if side is None or starts is None:
            return [False] * len(keys)
        cache_keys = [storage_names.storage_key(k) for k in keys]
        if load:
            done = self._load(side, cache_keys,
                              lambda cached, n: side.load(cached, starts[:n]))
        else:
            done = self._store(side, cache_keys, None, lambda first: side.store(starts[first:]))
        return [True] * done + [False] * (len(keys) - done)

    @staticmethod
    def _side_pages(side, transfer, keys):
        """The host pool's first slot of each key's page, or None (logged)."""
        if side is None:
            return None
        ps = int(side.host_pool.page_size) or 1
        indices = transfer.host_indices
        if indices is None or indices.numel() != len(keys) * ps:
            _log.error("hostkv storage: pool %s: %s host indices for %d keys of %d slots",
                       _name(transfer.name), None if indices is None else indices.numel(),
                       len(keys), ps)
            return None
        return [int(i) for i in indices[::ps].tolist()]
