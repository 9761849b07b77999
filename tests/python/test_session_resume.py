"""hostkvd SIGKILLed (or replaced with --takeover) under engines, started again
on the same socket with its state (deploy/README.md "Restarts and upgrades"): the
engines' sessions resume by themselves and their callers see no error.

The host pools follow SGLang's HiCacheController as modelled at
sgl-project/sglang @001067ff (tests/python/sglang_standin/srt/managers/
cache_controller.py): alloc() before a backup, None skips it;
backup_from_device_all_layer for a write-through; load_to_device_per_layer
layer by layer, the first call submitting every layer."""
import os
import subprocess
import threading
import time

import pytest

torch = pytest.importorskip("torch")

import hostkv  # noqa: E402
from conftest import Daemon  # noqa: E402
from hostkv.sglang import RemoteMHATokenToKVPoolHost  # noqa: E402
from sglang_model import DevicePool  # noqa: E402

LAYERS = 4
PAGE = 16


@pytest.fixture
def restartable():
    d = Daemon()
    yield d
    d.stop()


def engine(daemon, seed, size=256, head_num=2, head_dim=8):
    device = DevicePool("mha", LAYERS, size=size, page_size=PAGE, dtype=torch.bfloat16,
                        head_num=head_num, head_dim=head_dim)
    device.fill_random(torch.Generator().manual_seed(seed))
    host = RemoteMHATokenToKVPoolHost(device, 2.0, 0, PAGE, "page_first",
                                      target=daemon.target)
    return device, host


def pages_of(host_idx):
    return [(int(p) // PAGE, 1) for p in host_idx[::PAGE]]


def wait_until(predicate, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value is not None and value is not False:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_two_engines_carry_on_after_a_kill_9(restartable):
    engines = [engine(restartable, seed) for seed in (1, 2)]
    before = []
    for device, host in engines:
        host_idx = host.alloc(4 * PAGE)
        host.backup_from_device_all_layer(device, host_idx, torch.arange(4 * PAGE), "kernel")
        before.append((host_idx, host.client.read_pages(host.pool_name, pages_of(host_idx))))
    # Another session publishes pages of its own under keys.
    publisher = hostkv.Client(restartable.target, "publisher")
    pool = engines[0][1].pool_name
    runs = publisher.alloc(pool, 2 * PAGE)
    blob = bytes(range(256)) * (len(publisher.read_pages(pool, runs)) // 256)
    publisher.write_pages(pool, runs, blob)
    publisher.publish(pool, "ns", [b"key-0", b"key-1"],
                      [(first + i, 1) for first, n in runs for i in range(n)])
    # A load in flight in engine 0: its first layer waited for, the rest not.
    device0, host0 = engines[0]
    target = torch.arange(100, 100 + 4 * PAGE)
    device0.zero()
    host0.load_to_device_per_layer(device0, before[0][0], target, 0, "kernel")

    restartable.kill()
    restartable.restart()

    # The rest of the load completes: every layer's rows as backed up.
    for layer in range(1, LAYERS):
        host0.load_to_device_per_layer(device0, before[0][0], target, layer, "kernel")
    expected = DevicePool("mha", LAYERS, size=256, page_size=PAGE)
    expected.fill_random(torch.Generator().manual_seed(1))
    for plane, layers in enumerate(device0.planes()):
        for layer in range(LAYERS):
            assert torch.equal(layers[layer][100:100 + 4 * PAGE],
                               expected.planes()[plane][layer][:4 * PAGE]), (plane, layer)
    for (device, host), (host_idx, data) in zip(engines, before):
        # No exception reached the caller; the engine's pages are its own,
        # with their bytes; alloc and free go on.
        assert host.client.read_pages(host.pool_name, pages_of(host_idx)) == data
        more = wait_until(lambda h=host: h.alloc(PAGE))
        host.free(more)
        host.free(host_idx)
        host.backup_from_device_all_layer(device, host.alloc(PAGE), torch.arange(PAGE),
                                          "kernel")
    # Every published key is found again, byte-exact, by a new engine.
    reader = hostkv.Client(restartable.target, "reader")
    hit = reader.lookup(pool, "ns", [b"key-0", b"key-1"], acquire=True)
    assert hit.hits == 2
    assert reader.read_pages(pool, hit.pages) == blob
    stats = reader.get_pool_stats(pool)
    assert stats.restart.adopted and stats.restart.sessions_resumed >= 2
    for _, host in engines:
        host.close()
    reader.close()
    publisher.close()


def test_a_transfer_in_flight_at_the_kill_completes_after_the_restart(restartable):
    # 8 layers x 2048 rows of 8 x 128 bf16: ~64 MiB a copy, in flight for a while.
    device = DevicePool("mha", 8, size=2048, page_size=PAGE, dtype=torch.bfloat16,
                        head_num=8, head_dim=128)
    device.fill_random(torch.Generator().manual_seed(3))
    host = RemoteMHATokenToKVPoolHost(device, 1.0, 0, PAGE, "layer_first",
                                      target=restartable.target)
    client = host.client
    host_idx = host.alloc(2048)
    op = client.backup(host.pool_name, host.import_id,
                       [(int(host_idx[0]) // PAGE, 2048 // PAGE)], [(0, 2048)])
    restartable.kill()
    restartable.restart()
    client.wait(op, timeout=60)  # submitted again if it had not finished
    device2 = DevicePool("mha", 8, size=2048, page_size=PAGE, dtype=torch.bfloat16,
                         head_num=8, head_dim=128)
    device2.fill_random(torch.Generator().manual_seed(3))
    device.zero()
    for layer in range(8):
        host.load_to_device_per_layer(device, host_idx, torch.arange(2048), layer, "direct")
    for plane, layers in enumerate(device.planes()):
        for layer in range(8):
            assert torch.equal(layers[layer][:2048], device2.planes()[plane][layer][:2048])
    host.close()


def test_down_for_3_s_alloc_is_none_then_work_continues(restartable):
    device, host = engine(restartable, 4)
    held = host.alloc(2 * PAGE)
    restartable.kill()
    wait_until(lambda: host.client.daemon_away, 5)
    end = time.monotonic() + 3
    while time.monotonic() < end:
        assert host.available_size() == 0
        assert host.alloc(PAGE) is None  # no exception, no wait
        time.sleep(0.1)
    restartable.restart()
    fresh = wait_until(lambda: host.alloc(PAGE))
    assert host.free(held) == 2 * PAGE  # the pages held before are its own still
    host.backup_from_device_all_layer(device, fresh, torch.arange(PAGE), "kernel")
    host.close()


def test_three_takeovers_in_a_row_under_three_clients_traffic_fail_no_call(restartable):
    """Each --takeover daemon is itself taken over by the next: every one
    drains and exits 0, the last one serves, and no call of three clients
    fails (a daemon removes at its end only the socket paths still its own)."""
    stop = threading.Event()
    failures, cycles, longest = [], [0, 0, 0], [0.0, 0.0, 0.0]

    def traffic(n):
        c = hostkv.Client(restartable.target, f"traffic-{n}")
        c.create_pool(hostkv.mha_pool_spec("traffic", 1, 1, 8, 4, capacity_tokens=256))
        data = None
        while not stop.is_set():
            start = time.monotonic()
            try:
                runs = c.alloc("traffic", 8)
                if data is None:
                    data = bytes([n + 1]) * len(c.read_pages("traffic", runs))
                c.write_pages("traffic", runs, data)
                assert c.read_pages("traffic", runs) == data
                c.free("traffic", runs)
                c.probe()  # False while no daemon answers; never raises
            except Exception as e:  # pylint: disable=broad-except
                failures.append(repr(e))
            cycles[n] += 1
            longest[n] = max(longest[n], time.monotonic() - start)
        c.close()

    threads = [threading.Thread(target=traffic, args=(n,)) for n in (0, 1, 2)]
    for t in threads:
        t.start()
    for _ in range(3):
        time.sleep(1.5)
        old = restartable.process
        restartable.process = subprocess.Popen(restartable._args + ["--takeover"])  # pylint: disable=protected-access
        assert old.wait(timeout=30) == 0  # drained and exited
        restartable._wait_ready(False, None)  # pylint: disable=protected-access
    time.sleep(2)
    assert restartable.process.poll() is None  # the last one serves
    stop.set()
    for t in threads:
        t.join()
    assert failures == []
    assert min(cycles) > 50
    print(f"takeover: {sum(cycles)} cycles, the longest {max(longest) * 1e3:.1f} ms")
