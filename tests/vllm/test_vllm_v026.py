"""hostkv.vllm on vLLM v0.26+ (the C2 offloading API), end to end on the CPU
backend: the stand-in of vLLM's own files (standin/vllm, each module names
the commit it models) driven by engine.py in the connector's call order,
against a real hostkvd. Every loaded block is compared byte for byte with
the bytes its tokens give (engine.Instance._check_loaded)."""
import os
import signal
import subprocess
import sys
import time

import pytest

os.environ.setdefault("PYTHONHASHSEED", "0")
torch = pytest.importorskip("torch")

import engine as E  # noqa: E402
import hostkv  # noqa: E402
import hostkv.vllm  # noqa: E402
from hostkv import errors  # noqa: E402
from hostkv.vllm import chunks  # noqa: E402
from conftest import Daemon  # noqa: E402
from vllm.v1.kv_offload.base import (CanonicalKVCacheRef, CanonicalKVCaches,  # noqa: E402
                                     CanonicalKVCacheTensor, GPULoadStoreSpec, LookupResult,
                                     OffloadingSpec, ReqContext, make_offload_key)

HYBRID = [E.full(), E.sliding(32)]


def requests(prefix, n, blocks=6, first=1000):
    return [E.Request(f"{prefix}{i}", E.prompt(16 * blocks + 1, first + 31 * i), 16)
            for i in range(n)]


def test_the_installed_api_is_chosen_by_its_modules():
    assert hostkv.vllm.ERA == "v0.26+"
    spec_cls = hostkv.vllm.HostkvOffloadingSpec
    assert issubclass(spec_cls, OffloadingSpec)
    assert spec_cls.compact_group_layout is False  # vLLM's worker reads it


def test_an_older_base_api_is_refused_with_the_versions(tmp_path):
    # vLLM v0.21-v0.25: kv_offload/base.py with OffloadingSpec(vllm_config,
    # kv_cache_config) and no kv_offload/config.py.
    pkg = tmp_path / "vllm" / "v1" / "kv_offload"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "v1", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "base.py").write_text(
        "class OffloadingSpec:\n    def __init__(self, vllm_config, kv_cache_config): pass\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{os.environ['PYTHONPATH']}")
    out = subprocess.run([sys.executable, "-c", "import hostkv.vllm"], env=env,
                         capture_output=True, text=True, check=False)
    assert out.returncode != 0
    assert "v0.21-v0.25 are not served" in out.stderr, out.stderr
    assert "v0.26 and later" in out.stderr


def test_two_instances_tp2_hybrid_share_blocks_byte_exact_across_a_restart(daemon):
    a = E.Instance(daemon.target, HYBRID, tp=2, engine_id="a")
    assert a.run(requests("a", 3)) == {"a0": 0, "a1": 0, "a2": 0}
    a.close()
    daemon.kill()       # kill -9 between the two instances: the pool stays
    daemon.restart()
    b = E.Instance(daemon.target, HYBRID, tp=2, engine_id="b")
    hits = b.run(requests("b", 3))
    # 6 chunks of 16 tokens; one token is left to compute (sliding window)
    assert hits == {"b0": 96, "b1": 96, "b2": 96}
    # full attention: 6 blocks, sliding window 32: the last 2 blocks
    assert b.loaded_blocks == 3 * (6 + 2)
    b.close()


def test_groups_of_different_block_sizes_and_chunks_of_two_blocks(daemon):
    specs = [E.full(block=16), E.sliding(64, block=32)]
    extra = {"blocks_per_chunk": 2}
    a = E.Instance(daemon.target, specs, extra=extra, engine_id="a", num_blocks=96)
    a.run(requests("a", 2, blocks=8))
    a.close()
    b = E.Instance(daemon.target, specs, extra=extra, engine_id="b", num_blocks=96)
    hits = b.run(requests("b", 2, blocks=8))
    # chunks: 32 tokens (group 0), 64 tokens (group 1); 129 prompt tokens,
    # the last one computed
    assert all(h == 128 for h in hits.values()), hits
    assert b.loaded_blocks > 0
    b.close()


def test_data_parallel_replicas_share_and_report_kv_events(daemon):
    r0 = E.Instance(daemon.target, HYBRID, engine_id="e-dp0", dp_index=0, dp_size=2)
    r1 = E.Instance(daemon.target, HYBRID, engine_id="e-dp1", dp_index=1, dp_size=2)
    r0.run(requests("x", 2))
    stored = [e for e in r0.events if type(e).__name__ == "BlockStored"]
    # 6 full-attention chunks and 6 sliding-window ones per request (its
    # blocks are all allocated while the prompt is computed)
    assert len(stored) == 2 * 12
    assert {e.medium for e in stored} == {"CPU"}
    assert {e.group_idx for e in stored} == {0, 1}
    hits = r1.run(requests("y", 2))
    assert set(hits.values()) == {96}
    for inst in (r0, r1):
        inst.close()


def test_evictions_are_reported_as_removed_blocks(daemon):
    # a pool of ~16 blocks per group: the third request evicts
    inst = E.Instance(daemon.target, [E.full()], extra={"cpu_bytes_to_use": 16 * 2048},
                      engine_id="small")
    inst.run(requests("p", 4, blocks=6))
    time.sleep(0.2)
    inst.run([])  # a step or two more for the agent's eviction poll
    inst.run(requests("q", 1, blocks=1, first=9000))
    removed = [e for e in inst.events if type(e).__name__ == "BlockRemoved"]
    assert removed and all(e.medium == "CPU" for e in removed)
    inst.close()


def _lookup_timing(manager, key, rounds=100):
    worst, results = 0.0, set()
    for _ in range(rounds):
        t0 = time.monotonic()
        results.add(manager.lookup(key, ReqContext("r")))
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.01)
    return worst, results


def test_the_scheduler_never_waits_on_a_hung_daemon_and_nothing_fails(daemon):
    inst = E.Instance(daemon.target, HYBRID, engine_id="h")
    inst.run(requests("h", 1))
    os.kill(daemon.process.pid, signal.SIGSTOP)  # hostkvd answers nothing
    try:
        key = make_offload_key(b"\x07" * 32, 0)
        worst, results = _lookup_timing(inst.sched.manager, key)
        # microseconds normally; the bound leaves room for a loaded CI machine
        assert worst < 0.25, f"a lookup took {worst:.3f} s"
        # RETRY while the agent's question is out, then MISS (retry_for)
        assert results <= {LookupResult.RETRY, LookupResult.MISS}
        assert LookupResult.MISS in results
    finally:
        os.kill(daemon.process.pid, signal.SIGCONT)
    inst.close()


def test_with_hostkvd_dead_requests_still_run_and_stores_store_nothing(monkeypatch):
    monkeypatch.setenv("HOSTKV_RECONNECT_TIMEOUT", "1")
    d = Daemon()
    try:
        inst = E.Instance(d.target, HYBRID, engine_id="dead")
        d.kill()
        hits = inst.run(requests("z", 2))
        assert hits == {"z0": 0, "z1": 0}  # computed, not loaded; no exception
        d.restart()
        inst.close()
    finally:
        d.stop()


def test_held_blocks_are_misses_while_hostkvd_is_away(monkeypatch):
    monkeypatch.setenv("HOSTKV_RECONNECT_TIMEOUT", "1")
    d = Daemon()
    try:
        a = E.Instance(d.target, HYBRID, engine_id="a")
        a.run(requests("a", 1))
        b = E.Instance(d.target, HYBRID, engine_id="b", extra={"hostkv_hold_seconds": 60})
        assert b.run(requests("b", 1)) == {"b0": 96}
        assert b.sched.manager._board.held  # still held for 60 s
        d.kill()
        time.sleep(0.5)  # the sessions' sockets hang up: the clients know
        # The same prefix again: computed (a miss), never a load that
        # cannot come.
        assert b.run(requests("c", 1), max_steps=5000) == {"c0": 0}
        assert b.unfinished is None
        d.restart()
        b.close()
        a.close()
    finally:
        d.stop()


def test_a_daemon_that_lost_the_sessions_is_used_again_with_new_ones(daemon):
    a = E.Instance(daemon.target, HYBRID, engine_id="a")
    a.run(requests("a", 1))
    daemon.kill()
    daemon.restart("--discard_state")  # no pool, no session of the instance
    # The first requests miss and store nothing while the sessions are
    # replaced; then stores work again and a second instance hits.
    deadline = time.monotonic() + 30
    n = 0
    while time.monotonic() < deadline:
        n += 1
        a.run(requests(f"r{n}-", 1, first=20000 + 1000 * n))
        b = E.Instance(daemon.target, HYBRID, engine_id=f"b{n}")
        hits = b.run(requests(f"s{n}-", 1, first=20000 + 1000 * n))
        b.close()
        if hits == {f"s{n}-0": 96}:
            break
        time.sleep(1)
    else:
        raise AssertionError("the instance never stored again after the daemon lost it")
    a.close()


def test_a_full_pool_of_referenced_blocks_stores_nothing_and_runs_on():
    d = Daemon("--max_cache_refs_per_session=100000")
    try:
        cap = 8 * 4096  # 8 pages of one block (2 layers x 2 KiB)
        a = E.Instance(d.target, [E.full()], extra={"cpu_bytes_to_use": cap}, engine_id="a")
        a.run(requests("a", 1, blocks=6))
        # Another session holds a reference on every cached page.
        pool = a.workers[0].worker._groups[0].pool
        ns = a.workers[0].worker._groups[0].namespace
        holder = hostkv.Client(d.target, "holder")
        keys = [k for r in requests("a", 1, blocks=6) for k in
                [make_offload_key(h, 0) for h in r.block_hashes]]
        found = holder.lookup(pool, ns, keys, acquire=True)
        assert found.hits == 6
        before = a.workers[0].worker.stores_skipped
        hits = a.run(requests("n", 2, blocks=6, first=5000))
        assert hits == {"n0": 0, "n1": 0}
        assert a.workers[0].worker.stores_skipped > before
        holder.close()
        a.close()
    finally:
        d.stop()


def test_a_load_whose_blocks_are_gone_is_never_reported_done(daemon):
    a = E.Instance(daemon.target, HYBRID, engine_id="a")
    a.run(requests("a", 1))
    a.close()
    b = E.Instance(daemon.target, HYBRID, engine_id="b")

    def lose_state(inst, meta):
        if meta.load_jobs:
            daemon.kill()
            daemon.restart("--discard_state")  # every page and key gone

    b.run(requests("b", 1), before_transfers=lose_state, max_steps=200)
    # The load waits (logged) rather than report blocks that never came.
    assert b.unfinished["loading"] == ["b0"]
    assert b.loaded_blocks == 0
    b.close()


def test_fenced_stores_are_waited_for_before_their_blocks_are_reused(daemon):
    # 20 GPU blocks: each request's blocks are reused by the next one
    # while its deferred stores may still be in flight.
    a = E.Instance(daemon.target, [E.full()], engine_id="a", num_blocks=20)
    a.run(requests("a", 6, blocks=6))
    assert a.sched.flushed > 0
    a.close()
    b = E.Instance(daemon.target, [E.full()], engine_id="b", num_blocks=20)
    hits = b.run(requests("b", 6, blocks=6))
    assert all(h == 96 for h in hits.values()), hits
    assert b.loaded_blocks == 6 * 6
    b.close()


def test_reset_cache_gives_back_the_schedulers_references(daemon):
    a = E.Instance(daemon.target, [E.full()], engine_id="a")
    a.run(requests("a", 1))
    b = E.Instance(daemon.target, [E.full()], engine_id="b",
                   extra={"hostkv_hold_seconds": 60})
    b.run(requests("b", 1))
    board = b.sched.manager._board
    assert board.held  # held after the load, for hold_seconds
    b.sched.reset_cache()
    deadline = time.monotonic() + 5
    while board.held and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not board.held
    assert b.run(requests("c", 1)) == {"c0": 96}  # still served after the reset
    a.close()
    b.close()


def test_kv_caches_hostkv_cannot_copy_are_refused_at_start(daemon):
    inst = E.Instance(daemon.target, [E.full()], engine_id="a")
    spec = inst.workers[0].spec
    a = torch.zeros((8, 64), dtype=torch.int8)
    b = torch.zeros((8, 128), dtype=torch.int8)
    mixed = CanonicalKVCaches([CanonicalKVCacheTensor(a, 64), CanonicalKVCacheTensor(b, 128)],
                              [[CanonicalKVCacheRef(0, 64), CanonicalKVCacheRef(1, 128)]])
    with pytest.raises(errors.InvalidArgument, match="different page sizes"):
        spec.get_worker(mixed)
    strided = torch.zeros((8, 128), dtype=torch.int8)[:, :64]
    with pytest.raises(errors.InvalidArgument, match="apart"):
        spec.get_worker(CanonicalKVCaches([CanonicalKVCacheTensor(strided, 64)],
                                          [[CanonicalKVCacheRef(0, 64)]]))
    inst.close()


def test_a_job_is_split_per_group_as_vllms_worker_reads_it():
    k = [make_offload_key(bytes([i]) * 32, g) for g, i in ((0, 1), (0, 2), (1, 3))]
    spec = GPULoadStoreSpec([5, 6, 7, 9], [3, 1], [1, 5])
    runs = chunks.split_job(k, spec, {0: 0, 1: 1}, 2, 16, "job")
    # group 0 starts at block index 1: the second page of its first chunk
    assert [r.block_ids for r in runs] == [[5, 6, 7], [9]]
    assert runs[0].page_keys == [k[0] + b"\x00\x01", k[1] + b"\x00\x00", k[1] + b"\x00\x01"]
    assert runs[1].page_keys == [k[2] + b"\x00\x01"]
    with pytest.raises(errors.InvalidArgument, match="keys"):
        chunks.split_job(k[:2], spec, {0: 0, 1: 1}, 2, 16, "job")
    with pytest.raises(errors.InvalidArgument, match="outside"):
        chunks.split_job(k, GPULoadStoreSpec([5, 6, 7, 99], [3, 1], [1, 5]), {0: 0, 1: 1}, 2,
                         16, "job")
