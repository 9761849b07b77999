"""hostkv.sglang.linker.HostkvLinker: SGLang main's external linker
(UnifiedCacheLinker) on hostkvd, built by SGLang's linker factory from the
config flag and driven in the unified radix cache's call order
(sglang_linker_driver.py), against real daemons, TP=2, CPU backend: every
loaded row compared at the forward pass's per-layer wait."""
import time

import pytest

torch = pytest.importorskip("torch")

import sglang_linker_driver as drv  # noqa: E402
from conftest import Daemon  # noqa: E402


@pytest.fixture
def standin():
    with drv.standin():
        yield


_referenced = drv.referenced_pages


def test_the_factory_builds_it_from_the_config_flag(daemon, standin):
    from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker
    from hostkv.sglang.linker import HostkvLinker
    assert issubclass(HostkvLinker, UnifiedCacheLinker)
    assert not HostkvLinker.__abstractmethods__
    e = drv.Engine(daemon.target, tp=1)
    assert isinstance(e.ranks[0].linker, HostkvLinker)
    e.close()


def test_engine_b_loads_engine_as_prefix_layer_by_layer_across_a_restart(standin):
    d = Daemon()
    try:
        a = drv.Engine(d.target)
        assert a.request("a0", drv.prompt(12)) == []  # nothing to load: computed
        a.request("a1", drv.prompt(20, first=5000))
        a.poll(wait_offloads=True)
        assert a.stored == 2 and a.offload_failures == 0
        a.close()
        d.kill()      # kill -9: the pool and its cache stay
        d.restart()
        b = drv.Engine(d.target)
        loaded = b.request("b0", drv.prompt(12))
        assert len(loaded) == 12  # the whole prefix, from hostkvd
        assert b.rows_checked == 12 * 2 * 4 * 2  # pages x planes x layers x ranks
        # A longer prompt: its first 12 pages are on the device now, the
        # next 8 (another prompt's pages are not a prefix of it) computed.
        assert len(b.request("b1", drv.prompt(20))) == 0
        loaded = b.request("b2", drv.prompt(20, first=5000))
        assert len(loaded) == 20
        b.poll()
        pool = b.ranks[0].linker.pools["kv"]
        assert _referenced(d, pool) == 0  # the leases went with the completed loads
        b.close()
    finally:
        d.stop()


def test_a_trimmed_load_loads_the_adopted_pages_only(daemon, standin):
    a = drv.Engine(daemon.target)
    a.request("a", drv.prompt(10))
    a.poll(wait_offloads=True)
    b = drv.Engine(daemon.target)
    loaded = b.request("b", drv.prompt(10), trim=6)
    assert len(loaded) == 6
    b.poll()
    assert _referenced(daemon, b.ranks[0].linker.pools["kv"]) == 0
    a.close()
    b.close()


def test_cancel_and_reset_leave_nothing_referenced(daemon, standin, monkeypatch):
    from hostkv.sglang import linker as linker_module
    a = drv.Engine(daemon.target)
    a.request("a", drv.prompt(8))
    a.poll(wait_offloads=True)
    b = drv.Engine(daemon.target)
    pool = b.ranks[0].linker.pools["kv"]
    # An abort after load(): False (the load stays queued, its nodes locked),
    # then it runs with the next batch and is reported with its rid.
    assert b.request("b", drv.prompt(8), abort=True) == [False, False]
    indices = [rank.linker.start_layer_wise_loading() for rank in b.ranks]
    assert all(i >= 0 for i in indices)
    for r, rank in enumerate(b.ranks):
        rank.linker.layer_done_counter.set_consumer(indices[r])
        for layer in range(b.layers):
            rank.linker.layer_done_counter.wait_until(layer)
    deadline = time.monotonic() + 10
    while min(rank.linker.num_completed_loads() for rank in b.ranks) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert [rank.linker.pop_completed_load() for rank in b.ranks] == [["b"], ["b"]]
    assert _referenced(daemon, pool) == 0
    # A lookup repeated for the same rid replaces its lease; reset drops it.
    b.forget_device()
    for _ in range(3):
        assert b.match("c", drv.prompt(8))[2] == 8
    assert _referenced(daemon, pool) == 8
    for rank in b.ranks:
        rank.linker.reset()
    assert _referenced(daemon, pool) == 0
    # A lookup no load follows (the ranks agreed on less, the request went):
    # SGLang calls nothing; the lease goes after LEASE_SECONDS.
    monkeypatch.setattr(linker_module, "LEASE_SECONDS", 0.2)
    assert b.match("d", drv.prompt(8))[2] == 8
    assert _referenced(daemon, pool) == 8
    time.sleep(0.3)
    for rank in b.ranks:
        rank.linker.num_completed_loads()  # the scheduler polls every step
    assert _referenced(daemon, pool) == 0
    # Nothing queued: start returns -1, and a -1 consumer waits for nothing.
    assert b.ranks[0].linker.start_layer_wise_loading() == -1
    b.ranks[0].linker.layer_done_counter.set_consumer(-1)
    b.ranks[0].linker.layer_done_counter.wait_until(0)
    a.close()
    b.close()


def test_reset_forgets_offload_results(daemon, standin):
    e = drv.Engine(daemon.target, tp=1, extra={"hostkv_namespace": "reset"})
    e.request("x", drv.prompt(4))
    linker = e.ranks[0].linker
    linker.reset()  # waits for the offload, then forgets its result
    assert linker.num_completed_offloads() == 0
    e.close()


def test_a_daemon_away_under_a_running_engine_costs_misses_only(standin, monkeypatch):
    monkeypatch.setenv("HOSTKV_RECONNECT_TIMEOUT", "1")
    d = Daemon()
    try:
        a = drv.Engine(d.target)
        a.request("a", drv.prompt(8))
        a.poll(wait_offloads=True)
        b = drv.Engine(d.target)
        d.kill()
        time.sleep(0.5)  # the sessions' sockets hang up
        t0 = time.monotonic()
        assert b.request("b0", drv.prompt(8)) == []  # a miss, computed
        assert time.monotonic() - t0 < 0.5  # no lookup waited for the daemon
        b.poll(wait_offloads=True)
        assert b.offload_failures == 1  # the write-through stored nothing, no error
        d.restart()
        b.forget_device()
        deadline = time.monotonic() + 10
        while True:
            loaded = b.request(f"b{int(time.monotonic() * 1000)}", drv.prompt(8))
            if loaded or time.monotonic() > deadline:
                break
            b.forget_device()
            time.sleep(0.2)
        assert len(loaded) == 8  # A's pages, served again
        a.close()
        b.close()
    finally:
        d.stop()


def test_pages_hostkvd_evicted_are_misses(daemon, standin):
    # its own pool (a namespace text of its own): ~25 pages per rank
    e = drv.Engine(daemon.target, pages=64,
                   extra={"hostkv_capacity_bytes": 24 * 1024, "hostkv_namespace": "evict"})
    import hostkv  # pylint: disable=import-outside-toplevel
    with hostkv.Client(daemon.target, "probe") as c:
        pages = c.get_pool(e.ranks[0].linker.pools["kv"]).token_slots // 4
    prompts = pages // 10 * 2 + 2  # twice what the pool holds
    assert prompts < 100, f"the pool is not the small one made here ({pages} pages)"
    for i in range(prompts):
        e.request(f"p{i}", drv.prompt(10, first=1000 * (i + 1)))
        e.poll(wait_offloads=True)
        e.forget_device()  # the device pool is smaller than hostkv's
    assert e.stored == prompts
    e.forget_device()
    _, _, hit = e.match("again", drv.prompt(10, first=1000))
    assert hit < 10  # evicted: a shorter hit or none, never an error
    for rank in e.ranks:
        rank.linker.cancel_queued_load("again")
    e.close()


def test_the_plugin_entry_point_builds_the_cache_with_the_linker(daemon, standin):
    drv.load_hostkv_plugin()
    from sglang.srt.mem_cache.registry import registered_radix_cache_backends
    assert "hostkv" in registered_radix_cache_backends()
    a = drv.Engine(daemon.target, via="plugin", extra={"hostkv_namespace": "plugin"})
    a.request("a", drv.prompt(8))
    a.poll(wait_offloads=True)
    b = drv.Engine(daemon.target, via="plugin", extra={"hostkv_namespace": "plugin"})
    assert len(b.request("b", drv.prompt(8))) == 8
    a.close()
    b.close()


def test_the_plugin_refuses_what_it_cannot_serve(daemon, standin):
    drv.load_hostkv_plugin()
    from hostkv.sglang import plugin
    from sglang.srt.runtime_context import set_memory
    ctx = drv.build_context(drv._ServerArgs("m"), None, 0, 1, None,  # pylint: disable=W0212
                            is_hybrid_ssm=True)
    previous = set_memory(enable_unified_cache_external_linker=False)
    try:
        with pytest.raises(ValueError) as e:
            plugin.create_cache(ctx)
    finally:
        set_memory(**previous)
    assert "--enable-unified-cache-external-linker is not set" in str(e.value)
    assert "with Mamba state" in str(e.value)


def test_a_lost_session_fails_its_queued_loads_in_order(standin):
    """hostkvd restarted without its state between load() and the batch:
    the queued load copies nothing, is still reported with its rid (SGLang
    unlocks its nodes), and its layer waits raise rather than let the
    forward pass read what the slots held."""
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
    d = Daemon()
    try:
        a = drv.Engine(d.target, tp=1, extra={"hostkv_namespace": "lost"})
        a.request("a", drv.prompt(8))
        a.poll(wait_offloads=True)
        b = drv.Engine(d.target, tp=1, extra={"hostkv_namespace": "lost"})
        linker = b.ranks[0].linker
        _, tail, hit = b.match("q", drv.prompt(8))
        assert hit == 8
        slots = torch.arange(8 * b.page_size, dtype=torch.int64)
        assert linker.load("q", [PoolTransfer(name=PoolName.KV, keys=list(tail),
                                              device_indices=slots)])
        old = linker._client  # pylint: disable=protected-access
        d.kill()
        d.restart("--discard_state")
        deadline = time.monotonic() + 15
        while linker._client is old:  # pylint: disable=protected-access
            assert time.monotonic() < deadline, "the linker never opened a new session"
            assert linker.lookup("z", [PoolTransfer(name=PoolName.KV, keys=list(tail))]) == []
            time.sleep(0.2)
        index = linker.start_layer_wise_loading()
        assert index >= 0
        linker.layer_done_counter.set_consumer(index)
        with pytest.raises(RuntimeError, match="session was lost"):
            linker.layer_done_counter.wait_until(0)
        assert linker.num_completed_loads() == 1
        assert linker.pop_completed_load() == ["q"]
        a.close()
        b.close()
    finally:
        d.stop()
