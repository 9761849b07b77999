"""The SGLang classes as an engine uses them: several threads at once, and
an engine SIGKILLed in the middle of its copies."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")

import hostkv  # noqa: E402
from hostkv.sglang import RemoteMHATokenToKVPoolHost  # noqa: E402

from sglang_model import DevicePool  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def test_scheduler_and_io_threads_at_once(daemon):
    """One thread allocates and frees (SGLang's scheduler), another backs up
    and loads its own pages and checks their bytes (the I/O threads)."""
    device = DevicePool("mha", 2, size=256, page_size=16)
    host = RemoteMHATokenToKVPoolHost(device, 4.0, 0, 16, "page_first", target=daemon.target)
    failures = []

    def scheduler():
        try:
            for _ in range(200):
                got = host.alloc(32)
                if got is not None:
                    host.free(got)
        except Exception as e:  # pylint: disable=broad-except
            failures.append(e)

    def io(seed):
        try:
            g = torch.Generator().manual_seed(seed)
            slots = torch.arange(seed * 64, seed * 64 + 64)
            for _ in range(20):
                idx = host.alloc(64)
                assert idx is not None
                for t in device.k_buffer + device.v_buffer:
                    t[slots] = torch.randn(t[slots].shape, generator=g).to(t.dtype)
                want = [t[slots].clone() for t in device.k_buffer + device.v_buffer]
                host.backup_from_device_all_layer(device, idx, slots, "kernel")
                for t in device.k_buffer + device.v_buffer:
                    t[slots] = 0
                for layer in range(2):
                    host.load_to_device_per_layer(device, idx, slots, layer, "kernel")
                got = [t[slots] for t in device.k_buffer + device.v_buffer]
                assert all(torch.equal(a, b) for a, b in zip(want, got))
                host.free(idx)
        except Exception as e:  # pylint: disable=broad-except
            failures.append(e)

    threads = [threading.Thread(target=scheduler), threading.Thread(target=io, args=(0,)),
               threading.Thread(target=io, args=(1,))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        assert host.available_size() == host.size
        assert host.client.get_pool_stats(host.pool_name).pools[0].used_pages == 0
    finally:
        host.close()


def test_sigkilled_engine_mid_copy_is_reclaimed(daemon):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [HERE, os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen([sys.executable, os.path.join(HERE, "sglang_engine_child.py"),
                              daemon.target], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = child.stdout.readline().split()
        assert line[:1] == ["ready"], line
        pool = line[1]
        with hostkv.Client(daemon.target, "observer") as c:
            assert c.get_pool(pool).spec.name == pool
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            # The daemon sees the session socket close at once; the copy in
            # flight finishes first, then the pages, the import and the
            # private pool go. Wait for that, within a generous bound.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    c.get_pool(pool)
                except hostkv.errors.NotFound:
                    break
                time.sleep(0.05)
            with pytest.raises(hostkv.errors.NotFound):
                c.get_pool(pool)
            # The daemon serves on: another engine gets a pool of the same size.
            device = DevicePool("mha", 4, size=2048, page_size=16, head_num=8, head_dim=128)
            host = RemoteMHATokenToKVPoolHost(device, 2.0, 0, 16, "layer_first",
                                              target=daemon.target)
            assert host.alloc(2048) is not None
            host.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
