"""A pool serves while its memory is made resident (issue 40): CreatePool
returns at once, the first allocation is served before the pool is all
resident, the fill's progress shows in GetPoolStats, `hostkv stats` and
/metrics, an allocation larger than what is ready waits or fails as the
caller chose (with real codes), and a restarted daemon adopts the pool
resident, with nothing to fill."""
import os
import socket
import subprocess
import time
import urllib.request

import pytest

import hostkv
from conftest import Daemon
from prometheus_text import parse

POOL = "filling"
PAGE = 64
GIB = 1 << 30


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_stats(target):
    path = os.environ.get("HOSTKV_CLI")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("HOSTKV_CLI does not name the hostkv binary")
    out = subprocess.run([path, f"--target={target}", "stats"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def metric(url, family, pool):
    with urllib.request.urlopen(url, timeout=10) as r:
        families = parse(r.read().decode())
    for _, labels, value in families[family]["samples"]:
        if labels.get("pool") == pool:
            return value
    raise AssertionError(f"{family} has no sample of pool {pool}")


def stats_of(c, pool):
    (s,) = c.get_pool_stats(pool).pools
    return s


@pytest.fixture(scope="module")
def slow_fill():
    """One fill thread in 1 MiB chunks: a 2 GiB pool takes long enough
    (about a second here) to be seen filling."""
    port = free_port()
    d = Daemon("--pool_fill_threads=1", "--pool_fill_chunk=1MiB",
               f"--metrics_listen=127.0.0.1:{port}", "--metrics_namespace_names")
    d.metrics_url = f"http://127.0.0.1:{port}/metrics"
    yield d
    d.stop()


def spec(name, gib=2):
    # 4 layers x 8 heads x 128 x bf16 = 16 KiB per token, 1 MiB per page.
    return hostkv.mha_pool_spec(name, 4, 8, 128, PAGE, layout="layer_first",
                                capacity_bytes=gib * GIB)


def test_an_allocation_is_served_before_the_pool_is_resident(slow_fill):
    with hostkv.Client(slow_fill.target, "fill-test") as c:
        t0 = time.monotonic()
        pool = c.create_pool(spec(POOL))
        runs = c.alloc(POOL, PAGE)
        first = time.monotonic() - t0
        s = stats_of(c, POOL)
        assert sum(n for _, n in runs) == 1
        # Served while most of the pool is not yet resident.
        assert s.fill_state == hostkv.pb.FILL_FILLING, s
        assert 0 < s.ready_bytes < s.capacity_bytes == pool.total_bytes
        assert s.ready_pages * pool.page_bytes == s.ready_bytes
        assert s.fill_threads == 1 and s.fill_method == "populate"
        # Pages not yet resident count as free: nothing holds them.
        assert s.free_pages == s.capacity_pages - 1
        assert first < 1.0, first
        # The whole pool, asked now: the caller's choice of failure.
        everything = s.free_pages * PAGE
        with pytest.raises(hostkv.errors.FailedPrecondition) as e:
            c.alloc(POOL, everything, fill_no_wait=True)
        assert "still filling" in e.value.message
        with pytest.raises(hostkv.errors.DeadlineExceeded) as e:
            c.alloc(POOL, everything, fill_wait_ms=1)
        assert "still filling" in e.value.message
        # Operators see it: `hostkv stats` and /metrics.
        out = cli_stats(slow_fill.target)
        assert "memory: filling" in out, out
        ready = metric(slow_fill.metrics_url, "hostkv_pool_ready_bytes", POOL)
        assert 0 < ready < pool.total_bytes
        assert metric(slow_fill.metrics_url, "hostkv_pool_filling", POOL) == 1
        # Waiting (the default) gets the rest once it is resident.
        rest = c.alloc(POOL, everything)
        assert sum(n for _, n in rest) == s.free_pages
        s = stats_of(c, POOL)
        assert s.fill_state == hostkv.pb.FILL_READY, s
        assert s.ready_bytes == s.capacity_bytes and s.free_pages == 0
        assert s.fill_seconds > 0
        assert metric(slow_fill.metrics_url, "hostkv_pool_ready_bytes", POOL) == pool.total_bytes
        assert metric(slow_fill.metrics_url, "hostkv_pool_filling", POOL) == 0
        assert "memory: filling" not in cli_stats(slow_fill.target)
        # A request larger than the pool is full, filling or not.
        with pytest.raises(hostkv.errors.ResourceExhausted):
            c.alloc(POOL, PAGE)
        c.free(POOL, runs + rest)
        c.delete_pool(POOL)


def test_a_pool_deleted_while_filling_goes_at_once(slow_fill):
    with hostkv.Client(slow_fill.target, "fill-test") as c:
        c.create_pool(spec("short-lived"))
        t0 = time.monotonic()
        c.delete_pool("short-lived")
        assert time.monotonic() - t0 < 1.0
        assert not c.list_pools() or all(p.spec.name != "short-lived" for p in c.list_pools())


def test_a_restarted_daemon_adopts_the_pool_resident():
    d = Daemon("--pool_fill_threads=1")
    try:
        with hostkv.Client(d.target, "fill-test", reconnect_timeout=0) as c:
            c.create_pool(spec("kept", gib=1))
            while stats_of(c, "kept").fill_state == hostkv.pb.FILL_FILLING:
                time.sleep(0.01)
            c.alloc("kept", PAGE)
        d.kill()
        d.restart()
        with hostkv.Client(d.target, "after") as c:
            s = stats_of(c, "kept")
            # Nothing to fill: ready at once, all of it.
            assert s.fill_state == hostkv.pb.FILL_READY, s
            assert s.fill_method == "adopted" and s.fill_threads == 0
            assert s.ready_bytes == s.capacity_bytes
            runs = c.alloc("kept", PAGE, fill_no_wait=True)
            assert sum(n for _, n in runs) == 1
    finally:
        d.stop()


def free_hugetlb_2m():
    try:
        with open("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages") as f:
            return int(f.read())
    except OSError:
        return 0


def test_where_the_memory_goes_is_asked_per_pool(slow_fill):
    with hostkv.Client(slow_fill.target, "fill-test") as c:
        # 64 MiB on NUMA node 0 (every machine has one), 4 KiB pages.
        pool = c.create_pool(hostkv.mha_pool_spec(
            "placed", 4, 8, 128, PAGE, capacity_bytes=64 << 20, hugepages="off",
            numa_node="0"))
        assert pool.numa_node == 0 and pool.hugepages == "4K"
        s = stats_of(c, "placed")
        assert s.numa_node == 0 and s.hugepages == "4K"
        c.delete_pool("placed")
        with pytest.raises(hostkv.errors.InvalidArgument) as e:
            c.create_pool(hostkv.mha_pool_spec("placed", 4, 8, 128, PAGE,
                                               capacity_bytes=64 << 20, numa_node="999"))
        assert "not online" in e.value.message
        with pytest.raises(hostkv.errors.InvalidArgument):
            c.create_pool(hostkv.mha_pool_spec("placed", 4, 8, 128, PAGE,
                                               capacity_bytes=64 << 20, hugepages="4M"))
        if free_hugetlb_2m() < 32:
            # Too few hugetlb pages: the error names the sysctl to raise.
            with pytest.raises(hostkv.errors.ResourceExhausted) as e:
                c.create_pool(hostkv.mha_pool_spec("placed", 4, 8, 128, PAGE,
                                                   capacity_bytes=64 << 20, hugepages="2M"))
            assert "vm.nr_hugepages" in e.value.message
        else:
            pool = c.create_pool(hostkv.mha_pool_spec(
                "placed", 4, 8, 128, PAGE, capacity_bytes=64 << 20, hugepages="2M"))
            assert pool.hugepages == "2M"
            runs = c.alloc("placed", PAGE)
            c.free("placed", runs)
            c.delete_pool("placed")
