"""Two nodes through SGLang's storage API: two hostkvd daemons (separate
sockets, pools and memory) share a real redis-server, or one directory, as
their storage tier. An engine on node A stores a prompt's pages with
HostkvStorage.batch_set_v1; an engine on node B, whose daemon never held
them, finds them with batch_exists and loads identical bytes with
batch_get_v1 (real torch tensors on both sides)."""
import os
import shutil
import subprocess
import tempfile
import time

import pytest

pytest.importorskip("torch")

from conftest import Daemon  # noqa: E402
from storage_fixtures import Engine, StorageConfig, tokens_of  # noqa: E402


@pytest.fixture(scope="module")
def redis_socket():
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    workdir = tempfile.mkdtemp(prefix="hostkv-pytest-redis-")
    sock = os.path.join(workdir, "redis.sock")
    server = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", sock, "--save", "",
         "--appendonly", "no", "--dir", workdir], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not os.path.exists(sock):
        assert server.poll() is None and time.monotonic() < deadline, "redis did not start"
        time.sleep(0.02)
    yield sock
    server.kill()
    server.wait()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def tier_dir():
    path = tempfile.mkdtemp(prefix="hostkv-pytest-tier-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def tier_url(kind, redis_socket, tier_dir):
    return f"redis+unix:{redis_socket}" if kind == "redis" else f"file:{tier_dir}"


def wait_written(engine, count):
    deadline = time.monotonic() + 20
    while True:
        tier = engine.storage.client.get_pool_stats().tier
        if tier.written >= count or time.monotonic() > deadline:
            return tier
        time.sleep(0.02)


@pytest.mark.parametrize("host_pool", ["in-process", "remote"])
@pytest.mark.parametrize("kind", ["redis", "file"])
def test_pages_stored_on_one_node_load_byte_exact_on_another(kind, host_pool, request):
    url = tier_url(kind, request.getfixturevalue("redis_socket") if kind == "redis" else "",
                   request.getfixturevalue("tier_dir") if kind == "file" else "")
    flags = [f"--tier={url}", "--tier_fsync=false"]
    node_a, node_b = Daemon(*flags), Daemon(*flags)
    model, seed = f"org/tier-{kind}-{host_pool}", 33
    config = dict(remote=host_pool == "remote", pool_name=f"tier-{kind}-{host_pool}")
    try:
        a = Engine(node_a, "mha", "page_first", config=StorageConfig(model_name=model),
                   **config)
        try:
            idx, keys = a.prefill(tokens_of(seed, 5 * 16), seed=seed)
            assert a.storage.batch_set_v1(keys, idx) == [True] * 5
            expected = a.page_bytes(idx)
            tier = wait_written(a, 5)
            assert tier.serving and tier.written == 5, tier
        finally:
            a.close()
        b = Engine(node_b, "mha", "page_first", config=StorageConfig(model_name=model),
                   **config)
        try:
            assert b.storage.batch_exists(keys) == 5
            target = b.host.alloc(5 * 16)
            assert b.page_bytes(target) != expected
            assert b.storage.batch_get_v1(keys, target) == [True] * 5
            assert b.page_bytes(target) == expected
            tier = b.storage.client.get_pool_stats().tier
            assert tier.read_hits == 5 and tier.read_corrupt == 0, tier
            # A key nobody stored stops the prefix: a miss, counted.
            more = keys + ["f" * 64]
            assert b.storage.batch_exists(more) == 5
        finally:
            b.close()
    finally:
        node_a.stop()
        node_b.stop()
