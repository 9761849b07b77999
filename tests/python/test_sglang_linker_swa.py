"""HostkvLinker on a hybrid sliding-window model (SGLang's SWAKVPool:
full-attention layers and window layers in pools of their own), built by
SGLang's linker factory and driven in the order of the wrapper and main's
SWA component (sglang_linker_swa_driver.py), against real daemons, TP=2,
CPU backend: every loaded row of every layer compared at the forward
pass's per-layer wait."""
import pytest

torch = pytest.importorskip("torch")

import sglang_linker_driver as drv  # noqa: E402
import sglang_linker_swa_driver as swa  # noqa: E402
from conftest import Daemon  # noqa: E402


@pytest.fixture
def standin():
    with drv.standin():
        yield


_referenced = drv.referenced_pages


def test_a_window_model_loads_kv_and_its_window_across_a_restart(standin):
    d = Daemon()
    try:
        a = swa.SwaEngine(d.target, extra={"hostkv_namespace": "restart"})
        pools = a.ranks[0].linker.pools
        assert set(pools) == {"kv", "swa"} and pools["kv"] != pools["swa"]
        a.request("a", drv.prompt(12))
        assert a.stored == 1 and a.offload_failures == 0
        a.close()
        d.kill()
        d.restart()
        b = swa.SwaEngine(d.target, extra={"hostkv_namespace": "restart"})
        loaded = b.request("b", drv.prompt(14))
        # Every rank answers the one length whose window is stored: 12.
        assert b.lookups[0] == [[12], [12]]
        assert len(loaded["kv"]) == 12 and len(loaded["swa"]) == 3  # window: 10 tokens
        # rows: pages x layers x ranks (per part)
        assert b.rows_checked == {"kv": 12 * 2 * 2, "swa": 3 * 4 * 2}
        for name, pool in b.ranks[0].linker.pools.items():
            assert _referenced(d, pool) == 0, name  # leases went with the load
        b.close()
    finally:
        d.stop()


def test_a_prefix_whose_window_was_never_stored_is_a_miss(daemon, standin):
    a = swa.SwaEngine(daemon.target, extra={"hostkv_namespace": "nowindow"})
    a.request("a", drv.prompt(12))
    b = swa.SwaEngine(daemon.target, extra={"hostkv_namespace": "nowindow"})
    # Shares 9 pages: their KV is stored, the window ending at page 9 not
    # (pages 6-8 were out of the window when they were offloaded).
    tokens = drv.prompt(9) + drv.prompt(3, first=9000)
    loaded = b.request("b", tokens)
    assert loaded == {"kv": [], "swa": []}
    assert b.lookups[0] == [[], []]
    for pool in b.ranks[0].linker.pools.values():
        assert _referenced(daemon, pool) == 0  # nothing held for a miss
    a.close()
    b.close()


def test_a_short_window_moves_the_length_back_to_a_stored_window(daemon, standin):
    a = swa.SwaEngine(daemon.target, extra={"hostkv_namespace": "probes"})
    a.request("a8", drv.prompt(8))    # KV 0-7, window 5-7
    a.request("a12", drv.prompt(12))  # device hit 8; KV 8-11, window 9-11
    assert a.stored == 2
    b = swa.SwaEngine(daemon.target, extra={"hostkv_namespace": "probes"})
    # 11 pages of KV hit; the window ending at 11 (8-10) lacks page 8: the
    # longest length with a stored window is 8 (pages 5-7).
    loaded = b.request("b", drv.prompt(11) + drv.prompt(2, first=7000))
    assert b.lookups[0] == [[8], [8]]
    assert len(loaded["kv"]) == 8 and [h for h, _ in loaded["swa"]] == \
        [h for h, _ in loaded["kv"][5:8]]
    assert b.rows_checked["swa"] == 3 * 4 * 2
    for pool in b.ranks[0].linker.pools.values():
        assert _referenced(daemon, pool) == 0
    a.close()
    b.close()


def test_a_window_supplement_alone_is_stored_and_wrong_pools_are_refused(daemon, standin):
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer
    e = swa.SwaEngine(daemon.target, tp=1, extra={"hostkv_namespace": "supplement"})
    linker = e.ranks[0].linker
    keys = e.match("m", drv.prompt(3))[1]  # the page hashes, nothing stored yet
    slots = [e.free["swa"].pop(0) for _ in keys]
    for h, s in zip(keys, slots):
        e._write("swa", h, s)  # pylint: disable=protected-access
    # SGLang's sparse window retention offloads checkpoint windows alone.
    assert linker.offload([PoolTransfer(name=PoolName.SWA, keys=list(keys),
                                        device_indices=e._indices(slots),  # noqa: W0212
                                        hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    e.offloads += 1
    e.poll(wait_offloads=True)
    assert e.stored == 1
    import hostkv  # pylint: disable=import-outside-toplevel
    with hostkv.Client(daemon.target, "probe") as c:
        place = linker._parts["swa"].place  # pylint: disable=protected-access
        from hostkv.sglang.linker_pool import page_key
        assert c.lookup(place.pool, place.namespace, [page_key(k) for k in keys]).hits == 3
    # A pool this linker does not restore: nothing is stored, nothing found.
    assert not linker.offload([PoolTransfer(name=PoolName.MAMBA, keys=list(keys),
                                            device_indices=torch.zeros(1))])
    assert linker.lookup("x", [PoolTransfer(name=PoolName.KV, keys=list(keys)),
                               PoolTransfer(name=PoolName.MAMBA, keys=list(keys))]) == []
    e.close()


def test_an_swa_component_over_a_plain_pool_is_refused(daemon, standin):
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from hostkv.sglang.linker import HostkvLinker
    pool = drv.Engine(daemon.target, tp=1).ranks[0]
    with pytest.raises(ValueError, match="no sliding-window pool"):
        HostkvLinker(drv._ServerArgs("m"), drv._Params(pool.kv, 4),  # noqa: W0212
                     components={ComponentType.FULL, ComponentType.SWA},
                     extra_config={"hostkv_target": daemon.target})
    with pytest.raises(ValueError, match="MAMBA"):
        HostkvLinker(drv._ServerArgs("m"), drv._Params(pool.kv, 4),  # noqa: W0212
                     components={ComponentType.FULL, ComponentType.MAMBA},
                     extra_config={"hostkv_target": daemon.target})
    pool.linker.close()


def test_the_plugin_builds_a_window_models_cache_with_both_components(daemon, standin):
    drv.load_hostkv_plugin()
    from sglang.srt.mem_cache.registry import create_tree_cache
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.runtime_context import set_memory
    import json  # pylint: disable=import-outside-toplevel
    import os  # pylint: disable=import-outside-toplevel
    donor = swa.SwaEngine(daemon.target, tp=1, extra={"hostkv_namespace": "plugin"})
    kv = donor.ranks[0].kv
    params = swa._Params(kv, 4, 10)  # pylint: disable=protected-access
    worker = drv._TpWorker()  # pylint: disable=protected-access
    previous = set_memory(enable_unified_cache_external_linker=True,
                          radix_cache_backend="hostkv")
    os.environ["HOSTKV_LINKER_CONFIG"] = json.dumps(
        {"hostkv_target": daemon.target, "hostkv_namespace": "plugin",
         "hostkv_capacity_bytes": 32 << 20})
    try:
        cache = create_tree_cache(drv.build_context(
            drv._ServerArgs("org/gemma-test"), params, 0, 1, worker,  # noqa: W0212
            is_hybrid_swa=True))
    finally:
        set_memory(**previous)
        os.environ.pop("HOSTKV_LINKER_CONFIG")
    assert set(cache.components) == {ComponentType.FULL, ComponentType.SWA}
    linker = cache.linker.cache_linker
    assert linker.pools == donor.ranks[0].linker.pools  # the same pages
    assert kv.layer_transfer_counter is linker.layer_done_counter
    linker.close()
    donor.close()
