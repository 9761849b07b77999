"""hostkv.vllm against a stand-in of vLLM's offloading API
(tests/python/vllm_standin: factory.py @07b13497a9b52274d334090a9a8e04d5ec9ca7e9,
spec.py @0072b0b7443bdddf17824c78d4feae8e1fc12fb4 and, for the one-argument
constructor, @22d23bda218999bf27be116a99f2f734ad7c597e, abstract.py
@00d169bfa55967fc48d6f1b08cfc929c1cce3545, mediums.py
@0c2bbc477d0d615ee4d2581bbdfa966054db20f0, worker/worker.py
@06bb4a63a14b5b1f34ad9455e8e4aa017ee6e0f3, the connector's call order in
drive.py @0072b0b7) on a real hostkvd (CPU backend), with vLLM-shaped
torch KV caches."""
import os
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

os.environ.setdefault("PYTHONHASHSEED", "0")  # vLLM's hashes: the same in every instance

import vllm_fixtures as vf  # noqa: E402
from vllm_fixtures import Instance, block_bytes, prompt_hashes  # noqa: E402

import drive  # noqa: E402
import hostkv  # noqa: E402
from hostkv import errors  # noqa: E402
from vllm.v1.kv_offload.spec import OffloadingSpec  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _pool_stats(daemon, pool):
    with hostkv.Client(daemon.target, "stats") as c:
        (s,) = c.get_pool_stats(pool).pools
        return s


@pytest.fixture
def model(request):
    return "org/" + request.node.name.replace("[", "-").replace("]", "")


@pytest.mark.parametrize("era", drive.ERAS)
def test_vllm_factory_loads_the_spec_by_configuration(daemon, model, era):
    vc, kcc = vf.configs(daemon.target, model=model)
    spec = drive.create_spec(vc, kcc, era=era)
    assert isinstance(spec, OffloadingSpec)
    assert type(spec).__name__ == "HostkvOffloadingSpec"
    assert type(spec).__module__ == "hostkv.vllm.spec"
    # The constructor connects nowhere (vLLM builds one per process role).
    assert spec._manager is None
    # A misspelled module path fails as vLLM's factory fails.
    vc.kv_transfer_config.kv_connector_extra_config["spec_module_path"] = "hostkv.nope"
    with pytest.raises(ModuleNotFoundError):
        drive.create_spec(vc, kcc, era=era)


@pytest.mark.parametrize("era", drive.ERAS)
def test_blocks_move_byte_exact_between_instances_and_across_a_restart(daemon, model, era):
    hashes = prompt_hashes(6)
    a = Instance(daemon.target, seed=1, model=model, era=era)
    out, results = a.store(hashes, [3, 4, 5, 9, 10, 11])
    assert out.block_hashes_to_store == hashes and out.block_hashes_evicted == []
    assert [r.success for r in results] == [True]
    assert results[0].transfer_size == 6 * 4 * vf.BLOCK * 2 * 32 * 2
    stored = block_bytes(a.caches[0], [3, 4, 5, 9, 10, 11])
    # Stored again: every block is there already, nothing to store.
    again, _ = a.store(hashes, [3, 4, 5, 9, 10, 11])
    assert again.block_hashes_to_store == []

    b = Instance(daemon.target, seed=2, model=model, era=era)
    assert not torch.equal(block_bytes(b.caches[0], [20, 21, 22, 23, 24, 25]), stored)
    hits, results = b.load(hashes, [20, 21, 22, 23, 24, 25])
    assert hits == 6 and [r.success for r in results] == [True]
    assert torch.equal(block_bytes(b.caches[0], [20, 21, 22, 23, 24, 25]), stored)
    # A request whose first 2 blocks are computed on the GPU loads the rest.
    hits, _ = b.load(hashes, [0, 1, 2, 6, 7, 8], start=2)
    assert hits == 4
    assert torch.equal(block_bytes(b.caches[0], [2, 6, 7, 8]), stored[2:])
    b.close()

    a.close()  # "restart": new sessions, new KV caches
    a2 = Instance(daemon.target, seed=3, model=model, era=era)
    hits, results = a2.load(hashes, list(range(31, 25, -1)))
    assert hits == 6 and results[0].success
    assert torch.equal(block_bytes(a2.caches[0], list(range(31, 25, -1))), stored)
    a2.close()
    # Nobody holds a reference or a page now; the blocks stay cached.
    pool = a2.sched.spec._layout.pool(0)
    s = _pool_stats(daemon, pool)
    assert s.cache.referenced_pages == 0
    assert s.used_pages == s.cached_pages == 6


def test_other_models_and_layouts_do_not_share(daemon, model):
    hashes = prompt_hashes(2)
    a = Instance(daemon.target, seed=1, model=model)
    a.store(hashes, [0, 1])
    for kw in ({"model": model + "-other"}, {"model": model, "extra": {"hostkv_namespace": "v2"}}):
        other = Instance(daemon.target, seed=2, **kw)
        assert other.sched.manager.lookup(hashes) == 0
        other.close()
    a.close()


def test_tensor_parallel_ranks_keep_their_own_shards(daemon, model):
    hashes = prompt_hashes(4)
    a = Instance(daemon.target, seed=1, tp=2, model=model)
    _, results = a.store(hashes, [0, 1, 2, 3])
    assert [r.success for r in results] == [True, True]
    shards = [block_bytes(c, [0, 1, 2, 3]) for c in a.caches]
    assert not torch.equal(shards[0], shards[1])
    b = Instance(daemon.target, seed=2, tp=2, model=model)
    hits, results = b.load(hashes, [10, 11, 12, 13])
    assert hits == 4 and [r.success for r in results] == [True, True]
    for rank in (0, 1):
        assert torch.equal(block_bytes(b.caches[rank], [10, 11, 12, 13]), shards[rank])
    # A block whose shard one rank lost is a miss: rank 1 evicts all of its
    # shards (another instance fills rank 1's pool), rank 0 keeps them.
    layout = a.sched.spec._layout
    with hostkv.Client(daemon.target, "filler") as c:
        pool = layout.pool(1)
        free = _pool_stats(daemon, pool).free_pages
        pages = c.alloc(pool, free + 4)  # needs the 4 cached pages: evicts them
        c.free(pool, pages)
    assert b.sched.manager.lookup(hashes) == 0
    assert _pool_stats(daemon, layout.pool(0)).cache.cached_pages == 4
    a.close()
    b.close()


def test_eviction_under_pressure_reports_the_evicted_hashes(daemon, model):
    # Room for 8 blocks (the pool adds one page): 8 KiB per block here (4
    # tensors of 16 tokens x 2 heads x 32 x 2 bytes).
    a = Instance(daemon.target, seed=1, model=model, capacity_bytes=7 * 8192)
    first, second = prompt_hashes(6, 1000), prompt_hashes(6, 5000)
    a.store(first, list(range(6)))
    list(a.sched.take_events())
    out, results = a.store(second, list(range(6, 12)))
    assert results[0].success
    events = a.sched.take_events()
    removed = [h for e in events if isinstance(e, drive.BlockRemoved) for h in e.block_hashes]
    stored = [h for e in events if isinstance(e, drive.BlockStored) for h in e.block_hashes]
    # 6 + 6 blocks in 8 pages: the 4 coldest of the first prompt, its tail
    # first (leaves before parents), went.
    assert sorted(removed) == sorted(first[2:]) and len(removed) == 4
    assert stored == second
    # The next prepare_store sees no new eviction; the next lookup finds
    # the first prompt's surviving head only.
    assert a.sched.manager.lookup(first) == 2
    out = a.sched.manager.prepare_store(prompt_hashes(1, 9000))
    assert out.block_hashes_evicted == []
    a.close()


def test_blocks_being_loaded_are_not_evicted(daemon, model):
    a = Instance(daemon.target, seed=1, model=model, capacity_bytes=7 * 8192)
    hashes = prompt_hashes(4)
    a.store(hashes, [0, 1, 2, 3])
    hits, transfer = a.sched.lookup_and_prepare_load(hashes, [10, 11, 12, 13])
    assert hits == 4
    # Another prompt wants 8 pages; only 4 are free and the 4 cached are
    # pinned by the load: the worker's allocation fails, the job ends
    # without storing, and the loading blocks stay.
    out, results = a.store(prompt_hashes(8, 7000), list(range(16, 24)))
    assert results[0].success and a.workers[0].worker.handlers[0].store.store_skipped == 8
    job = a.workers[0].submit(transfer)
    assert a.workers[0].wait([job])[job].success
    a.sched.complete_load(hashes)
    assert torch.equal(block_bytes(a.caches[0], [10, 11, 12, 13]),
                       block_bytes(a.caches[0], [0, 1, 2, 3]))
    assert a.sched.manager.lookup(prompt_hashes(8, 7000)) == 0
    a.close()


def test_bad_input_gets_vllms_answers_and_changes_nothing(daemon, model):
    a = Instance(daemon.target, seed=1, model=model)
    hashes = prompt_hashes(3)
    a.store(hashes, [0, 1, 2])
    pool = a.sched.spec._layout.pool(0)
    before = _pool_stats(daemon, pool)
    m = a.sched.manager
    # Unknown hashes: a lookup miss; prepare_load of them refused.
    assert m.lookup(prompt_hashes(3, 4242)) == 0
    with pytest.raises(errors.FailedPrecondition):
        m.prepare_load(prompt_hashes(3, 4242))
    # Jobs with duplicate or out-of-range block ids, or counts that do not
    # match, are not submitted (False, as vLLM's worker reports a handler
    # exception).
    w = a.workers[0]
    out = m.prepare_store(prompt_hashes(2, 777))
    from vllm.v1.kv_offload.mediums import GPULoadStoreSpec
    assert w.submit((GPULoadStoreSpec([5, 5], (2,)), out.store_spec)) is None
    assert w.submit((GPULoadStoreSpec([5, 32], (2,)), out.store_spec)) is None
    assert w.submit((GPULoadStoreSpec([-1, 4], (2,)), out.store_spec)) is None
    assert w.submit((GPULoadStoreSpec([5], (1,)), out.store_spec)) is None
    hits, transfer = a.sched.lookup_and_prepare_load(hashes, [7, 8, 9])
    src, _ = transfer
    assert w.submit((src, GPULoadStoreSpec([7, 7, 9], (3,)))) is None
    assert w.submit((src, GPULoadStoreSpec([7, 8, 99], (3,)))) is None
    a.sched.complete_load(hashes)
    after = _pool_stats(daemon, pool)
    assert after.used_pages == before.used_pages == 3
    assert after.cache.referenced_pages == 0
    assert w.worker.handlers[0].store.jobs == {}
    a.close()


def test_a_killed_worker_leaves_nothing_pinned(daemon, model):
    hashes = prompt_hashes(4)
    a = Instance(daemon.target, seed=1, model=model)
    a.store(hashes, [0, 1, 2, 3])
    pool = a.sched.spec._layout.pool(0)
    child = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "vllm_worker_child.py"), daemon.target, model],
        stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])))
    try:
        line = child.stdout.readline().split()
        assert line[:1] == ["ready"], line
        # The child holds references (a load in flight) and unpublished
        # pages (a store in flight) when it dies.
        s = _pool_stats(daemon, pool)
        assert s.cache.referenced_pages >= 4 and s.used_pages > 4
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    import time
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        s = _pool_stats(daemon, pool)
        if s.cache.referenced_pages == 0 and s.used_pages == s.cached_pages:
            break
        time.sleep(0.05)
    assert s.cache.referenced_pages == 0
    assert s.used_pages == s.cached_pages == 4
    assert a.sched.manager.lookup(hashes) == 4
    a.close()


def test_kv_caches_hostkv_cannot_serve_are_refused_clearly(daemon, model):
    from vllm.v1.kv_offload.spec import CanonicalKVCaches, CanonicalKVCacheTensor
    vc, kcc = vf.configs(daemon.target, model=model)
    spec = drive.create_spec(vc, kcc)
    a = hostkv.torch.shm_tensor((8, 64), torch.int8)
    b = hostkv.torch.shm_tensor((8, 128), torch.int8)
    with pytest.raises(errors.InvalidArgument, match="hybrid"):
        list(spec.get_handlers(CanonicalKVCaches([CanonicalKVCacheTensor(a, 64),
                                                  CanonicalKVCacheTensor(b, 128)], [[]])))
    strided = hostkv.torch.shm_tensor((8, 128), torch.int8)[:, :64]
    with pytest.raises(errors.InvalidArgument, match="apart"):
        list(spec.get_handlers(CanonicalKVCaches([CanonicalKVCacheTensor(strided, 64)], [[]])))


def test_instances_outlive_a_daemon_restart(model):
    from conftest import Daemon
    d = Daemon()
    try:
        hashes = prompt_hashes(4)
        a = Instance(d.target, seed=1, model=model)
        a.store(hashes, [0, 1, 2, 3])
        stored = block_bytes(a.caches[0], [0, 1, 2, 3])
        d.process.terminate()  # a graceful restart: the next daemon adopts the pool
        d.process.wait()
        d.restart()
        # The same instance goes on: its sessions resume, its worker's KV
        # buffers are registered again, the blocks are still cached.
        hits, results = a.load(hashes, [10, 11, 12, 13])
        assert hits == 4 and results[0].success
        assert torch.equal(block_bytes(a.caches[0], [10, 11, 12, 13]), stored)
        # And a new instance finds them too.
        b = Instance(d.target, seed=2, model=model)
        hits, results = b.load(hashes, [5, 6, 7, 8])
        assert hits == 4 and results[0].success
        assert torch.equal(block_bytes(b.caches[0], [5, 6, 7, 8]), stored)
        b.close()
        a.close()
    finally:
        d.stop()


def test_offloaded_blocks_of_several_gpu_blocks(daemon, model):
    # extra_config block_size 32 over 16-token GPU blocks: 2 per host page.
    extra = {"block_size": 32}
    a = Instance(daemon.target, seed=1, model=model, extra=extra)
    assert a.sched.factor == 2
    from vllm.v1.core.kv_cache_utils import BlockHashListWithBlockSize
    hashes = list(BlockHashListWithBlockSize(prompt_hashes(6), vf.BLOCK, 2 * vf.BLOCK))
    assert len(hashes) == 3 and len(hashes[0]) == 64
    gpu = [4, 5, 12, 13, 20, 21]
    a.store(hashes, gpu)
    b = Instance(daemon.target, seed=2, model=model, extra=extra)
    hits, results = b.load(hashes, [0, 1, 2, 3, 6, 7])
    assert hits == 3 and results[0].success
    assert torch.equal(block_bytes(b.caches[0], [0, 1, 2, 3, 6, 7]), block_bytes(a.caches[0], gpu))
    # A load that starts inside an offloaded block is refused, not half-done.
    from vllm.v1.kv_offload.mediums import GPULoadStoreSpec
    src = b.sched.manager.prepare_load(hashes[:1])
    assert b.workers[0].submit((src, GPULoadStoreSpec([9, 10], (2,), block_indices=(1,)))) is None
    b.sched.manager.complete_load(hashes[:1])
    # Longer hashes than a key (64 bytes here, 96 with 3 per block) are
    # keyed by their digest; evictions come back as vLLM's hashes.
    b.close()
    a.close()


def test_the_v0_11_worker_api_takes_a_dict_of_layer_caches(daemon, model):
    # vLLM v0.11-v0.13: spec_cls(vllm_config), get_handlers(kv_caches:
    # dict[str, torch.Tensor]) with FlashAttention's per-layer caches.
    vc, kcc = vf.configs(daemon.target, model=model)
    spec = drive.create_spec(vc, era="v0.11")
    caches = vf.flash_attn_caches(kcc, seed=4)
    handlers = list(spec.get_handlers(caches))
    assert [(s.medium(), d.medium()) for s, d, _ in handlers] == [("GPU", "CPU"), ("CPU", "GPU")]
    store = handlers[0][2].store
    assert store.row_bytes == 4 * vf.BLOCK * 2 * 32 * 2  # K and V of 2 layers
    handlers[0][2].shutdown()


def test_a_pool_made_by_another_instance_with_another_size_is_used(daemon, model):
    a = Instance(daemon.target, seed=1, model=model, capacity_bytes=1 << 20)
    b = Instance(daemon.target, seed=2, model=model, capacity_bytes=2 << 20)  # attaches
    hashes = prompt_hashes(2)
    a.store(hashes, [0, 1])
    assert b.load(hashes, [2, 3])[0] == 2
    a.close()
    b.close()


def test_several_kv_cache_groups_are_refused(daemon, model):
    from vllm.v1.kv_offload.spec import (CanonicalKVCacheRef, CanonicalKVCaches,
                                         CanonicalKVCacheTensor)
    vc, kcc = vf.configs(daemon.target, model=model)
    spec = drive.create_spec(vc, kcc)
    t = [hostkv.torch.shm_tensor((8, 64), torch.int8) for _ in range(2)]
    two_groups = CanonicalKVCaches([CanonicalKVCacheTensor(x, 64) for x in t],
                                   [[CanonicalKVCacheRef(0, 64)], [CanonicalKVCacheRef(1, 64)]])
    with pytest.raises(errors.InvalidArgument, match="KV cache groups"):
        list(spec.get_handlers(two_groups))
    # A job naming two groups is not submitted either.
    a = Instance(daemon.target, seed=1, model=model)
    out = a.sched.manager.prepare_store(prompt_hashes(2, 31))
    from vllm.v1.kv_offload.mediums import GPULoadStoreSpec
    assert a.workers[0].submit((GPULoadStoreSpec([1, 2], (1, 1)), out.store_spec)) is None
    a.close()


def test_a_lookup_past_the_reference_cap_is_a_miss_holding_nothing(model):
    from conftest import Daemon
    d = Daemon("--max_cache_refs_per_session=6")
    try:
        a = Instance(d.target, seed=1, tp=2, model=model)
        hashes = prompt_hashes(4)
        a.store(hashes, [0, 1, 2, 3])
        m = a.sched.manager
        assert m.lookup(hashes) == 4  # holds 4 references on each rank
        # 4 more on rank 0 pass the cap of 6 held by the session: the old
        # hold is given back and the lookup retried.
        assert m.lookup(prompt_hashes(4)[:3] + prompt_hashes(1, 99)) == 3
        assert m.lookup(prompt_hashes(8, 500)) == 0
        for r in (0, 1):
            s = _pool_stats(d, a.sched.spec._layout.pool(r))
            assert s.cache.referenced_pages <= 4
        a.close()
        for r in (0, 1):
            assert _pool_stats(d, a.sched.spec._layout.pool(r)).cache.referenced_pages == 0
    finally:
        d.stop()


def test_the_standin_checks_itself():
    # The stand-in's own check (an in-memory spec through the connector's
    # call order), so that a broken stand-in cannot pass the tests above.
    out = subprocess.run([sys.executable, os.path.join(HERE, "vllm_standin", "selfcheck.py")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_requests_stores_over_several_steps_complete_as_one_set(daemon, model):
    # vLLM stores a request's blocks step by step and completes them once,
    # as the set of all of them (scheduler.py @0072b0b7 _reqs_being_stored).
    a = Instance(daemon.target, seed=1, model=model)
    hashes = prompt_hashes(6)
    m, w = a.sched.manager, a.workers[0]
    being_stored = set()
    for start in (0, 2, 4):
        out, transfer = a.sched.prepare_store(hashes[:start + 2], list(range(6)), start)
        job = w.submit(transfer)
        assert w.wait([job])[job].success
        being_stored |= set(out.block_hashes_to_store)
    list(a.sched.take_events())
    a.sched.complete_store(being_stored)
    stored = [h for e in a.sched.take_events() if isinstance(e, drive.BlockStored)
              for h in e.block_hashes]
    assert stored == hashes  # in chain order, every block
    # Loads: two requests load blocks; completing one (as a set) releases
    # only its references.
    pool = a.sched.spec._layout.pool(0)
    _, t1 = a.sched.lookup_and_prepare_load(hashes[:3], [10, 11, 12])
    _, t2 = a.sched.lookup_and_prepare_load(hashes, [20, 21, 22, 23, 24, 25], start=3)
    assert _pool_stats(daemon, pool).cache.referenced_pages == 6
    m.complete_load({hashes[2], hashes[0], hashes[1]})
    assert _pool_stats(daemon, pool).cache.referenced_pages == 3
    m.complete_load(set(hashes[3:]))
    assert _pool_stats(daemon, pool).cache.referenced_pages == 0
    a.close()


def test_the_scheduler_never_raises_while_hostkvd_is_away(model, monkeypatch):
    """hostkvd down for longer than reconnect_timeout: lookups are misses,
    stores store nothing, events wait; once it is back, the blocks are
    found again."""
    from conftest import Daemon
    d = Daemon()
    try:
        monkeypatch.setenv("HOSTKV_RECONNECT_TIMEOUT", "0.5")
        a = Instance(d.target, seed=1, model=model)
        hashes = prompt_hashes(4)
        a.store(hashes, [0, 1, 2, 3])
        m = a.sched.manager
        d.kill()
        assert m.lookup(hashes) == 0
        assert m.prepare_store(prompt_hashes(2, 77)) is None
        m.take_events()
        d.restart()
        assert m.lookup(hashes) == 4
        a.close()
    finally:
        d.stop()
