"""A warm restart through HostkvStorage: an engine process stores a
prompt's pages and is SIGKILLed; a new engine (another process, another
session) finds every key and loads identical bytes."""
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from storage_fixtures import Engine, StorageConfig, tokens_of  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _sessions(engine):
    (s,) = engine.storage.client.get_pool_stats(engine.storage.pool_name).pools
    return {u.session_number for u in s.sessions}


@pytest.mark.parametrize("kind", ["in-process", "remote"])
def test_sigkilled_engine_leaves_its_pages_to_the_next(daemon, kind):
    pool, model, seed = f"restart-{kind}", f"org/restart-{kind}", 21
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [HERE, os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "sglang_storage_child.py"), daemon.target, pool,
         model, kind, str(seed)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = child.stdout.readline().split()
        assert line[:1] == ["ready"], line
        child_session, stored = int(line[1]), int(line[2])
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        engine = Engine(daemon, "mha", "page_first", remote=kind == "remote",
                        pool_name=pool, config=StorageConfig(model_name=model))
        try:
            # The killed engine's session ends (its socket closed); wait for it.
            deadline = time.monotonic() + 30
            while child_session in _sessions(engine) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert child_session not in _sessions(engine)
            tokens = tokens_of(seed, 6 * 16)
            expected_idx, keys = engine.prefill(tokens, seed=seed)  # the same KV
            assert stored == len(keys) == 6
            assert engine.storage.batch_exists(keys) == 6
            target = engine.host.alloc(6 * 16)
            assert engine.page_bytes(target) != engine.page_bytes(expected_idx)
            assert engine.storage.batch_get_v1(keys, target) == [True] * 6
            assert engine.page_bytes(target) == engine.page_bytes(expected_idx)
        finally:
            engine.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
