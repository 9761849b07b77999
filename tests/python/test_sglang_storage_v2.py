"""HostkvStorage's v2 calls as SGLang's hybrid models make them
(mem_cache/hicache_storage.py at 001067fffe33427bee0ed2f007fb7551a1d76b44:
register_mem_host_pool_v2, batch_exists_v2 -> PoolTransferResult,
batch_get_v2 / batch_set_v2 -> {pool: [bool per key]}; the hybrid cache
controller at 00343773 registers every pool, KV included, and calls the
data calls without extra_info): the KV pool and a state pool of another
shape (a Mamba-like pool of one flat page per key) cross from one engine
to another byte for byte."""
import dataclasses
import enum
from typing import List, Optional

import pytest

torch = pytest.importorskip("torch")

from storage_fixtures import Engine, StorageConfig, make_storage, tokens_of  # noqa: E402


class PoolName(str, enum.Enum):  # SGLang's, the values used here
    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"


class PoolHitPolicy(str, enum.Enum):
    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


@dataclasses.dataclass
class PoolTransfer:  # SGLang's fields
    name: PoolName
    host_indices: Optional[torch.Tensor] = None
    device_indices: Optional[torch.Tensor] = None
    keys: Optional[List[str]] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: Optional[list] = None
    indices_from_pool: Optional[PoolName] = None


class StatePool:
    """A host pool of per-request state: page_size 1, a flat page of
    (2, 3, 5) float32 per slot, the flat-page calls SGLang's storage uses."""

    page_size = 1

    def __init__(self, size):
        self.size = size
        self.buf = torch.zeros((size, 2, 3, 5), dtype=torch.float32)

    def get_data_page(self, index, flat=True):
        page = self.buf[int(index)]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros((2, 3, 5), dtype=torch.float32).flatten()

    def set_from_flat_data_page(self, index, data_page):
        self.buf[int(index)] = data_page.reshape(2, 3, 5)


def _hybrid(daemon, state_size=32):
    engine = Engine(daemon)
    state = StatePool(state_size)
    storage = make_storage(engine.host, daemon.target, StorageConfig(model_name="hybrid/m"),
                           namespace="hybrid-test")
    storage.register_mem_host_pool_v2(engine.host, PoolName.KV)
    storage.register_mem_host_pool_v2(state, PoolName.MAMBA)
    return engine, state, storage


def test_kv_and_a_state_pool_cross_engines(daemon):
    a_engine, a_state, a = _hybrid(daemon)
    b_engine, b_state, b = _hybrid(daemon)
    try:
        host_indices, keys = a_engine.prefill(tokens_of(5, 64), seed=5)
        a_state.buf.copy_(torch.randn(a_state.buf.shape))
        state_slots = torch.tensor([7, 3, 11, 20])
        done = a.batch_set_v2([PoolTransfer(PoolName.KV, host_indices, keys=keys),
                               PoolTransfer(PoolName.MAMBA, state_slots, keys=keys)])
        assert done[PoolName.KV] == [True] * 4 and done[PoolName.MAMBA] == [True] * 4
        # B: every pool has all four pages.
        hit = b.batch_exists_v2(keys, [PoolTransfer(PoolName.MAMBA, keys=keys)])
        assert hit.kv_hit_pages == 4 and hit.extra_pool_hit_pages == {"kv": 4, "mamba": 4}
        b_host = b_engine.host.alloc(64)
        b_slots = torch.tensor([0, 1, 2, 3])
        got = b.batch_get_v2([PoolTransfer(PoolName.KV, b_host, keys=keys),
                              PoolTransfer(PoolName.MAMBA, b_slots, keys=keys)])
        assert got[PoolName.KV] == [True] * 4 and got["mamba"] == [True] * 4
        assert b_engine.page_bytes(b_host) == a_engine.page_bytes(host_indices)
        assert torch.equal(b_state.buf[b_slots], a_state.buf[state_slots])
    finally:
        for e in (a_engine, b_engine):
            e.close()
        a.close()
        b.close()


def test_hits_are_cut_to_what_every_pool_has(daemon):
    a_engine, a_state, a = _hybrid(daemon)
    try:
        host_indices, keys = a_engine.prefill(tokens_of(9, 96), seed=9)
        assert a.batch_set_v2([PoolTransfer(PoolName.KV, host_indices, keys=keys)])[
            PoolName.KV] == [True] * 6
        # State only for the first three pages' keys.
        a.batch_set_v2([PoolTransfer(PoolName.MAMBA, torch.arange(3), keys=keys[:3])])
        all_pages = a.batch_exists_v2(keys, [PoolTransfer(PoolName.MAMBA, keys=keys)])
        assert all_pages.kv_hit_pages == 3
        assert all_pages.extra_pool_hit_pages == {"kv": 6, "mamba": 3}
        # Trailing window of 2: pages [1, 3) have state, so 3 pages are usable.
        trailing = a.batch_exists_v2(
            keys, [PoolTransfer(PoolName.MAMBA, keys=keys[:2],
                                hit_policy=PoolHitPolicy.TRAILING_PAGES)])
        assert trailing.kv_hit_pages == 3
        # A pool nobody registered: misses, no exception (SGLang's threads live on).
        assert a.batch_get_v2([PoolTransfer(PoolName.SWA, torch.arange(2),
                                            keys=keys[:2])]) == {PoolName.SWA: [False] * 2}
        # Wrong number of host indices: misses, logged.
        assert a.batch_set_v2([PoolTransfer(PoolName.MAMBA, torch.arange(5),
                                            keys=keys[:2])]) == {PoolName.MAMBA: [False] * 2}
        nothing = a.batch_exists_v2([k[::-1] for k in keys],
                                    [PoolTransfer(PoolName.MAMBA, keys=keys)])
        assert nothing.kv_hit_pages == 0 and nothing.extra_pool_hit_pages == {}
    finally:
        a_engine.close()
        a.close()
