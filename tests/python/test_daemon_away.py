"""While hostkvd is away (server/README.md "While hostkvd is away"): a real daemon
SIGKILLed and started again on the same socket without its state
(--discard_state): engines degrade instead of crashing, and say once, naming
the cause, that the state is gone. With the state kept, sessions resume:
test_session_resume.py.

Modelled on SGLang's HiCacheController at sgl-project/sglang @001067ff
(tests/python/sglang_standin/srt/managers/cache_controller.py): the
controller asks the host pool alloc() before a backup and skips the backup
on None; an exception from the host pool ends the scheduler."""
import time

import pytest

torch = pytest.importorskip("torch")

import hostkv  # noqa: E402
from conftest import Daemon  # noqa: E402
from hostkv.sglang import RemoteMHATokenToKVPoolHost  # noqa: E402
from sglang_model import DevicePool, InProcessHostPool, page_keys  # noqa: E402
from storage_fixtures import make_storage, tokens_of  # noqa: E402


@pytest.fixture
def restartable():
    d = Daemon()
    yield d
    d.stop()


def test_a_call_waits_for_the_daemon_then_fails_clearly(restartable):
    c = hostkv.Client(restartable.target, "waiter", reconnect_timeout=1.5)
    c.create_pool(hostkv.mha_pool_spec("away", 1, 1, 8, 4, capacity_tokens=64))
    restartable.kill()
    start = time.monotonic()
    with pytest.raises(hostkv.errors.DaemonUnavailable) as e:
        c.alloc("away", 4)
    waited = time.monotonic() - start
    assert 1.4 <= waited < 5, waited
    assert "reconnect_timeout=1.5" in e.value.message and restartable.target in e.value.message
    assert c.daemon_away
    # Back, but without the session: the cause, once per call, at once.
    restartable.restart("--discard_state")
    with pytest.raises(hostkv.errors.SessionLost) as lost:
        c.alloc("away", 4)
    assert "came back without this session" in lost.value.message
    start = time.monotonic()
    with pytest.raises(hostkv.errors.SessionLost):
        c.get_pool("away")
    assert time.monotonic() - start < 0.5
    c.close()  # no error: the session went with the daemon


def test_no_wait_calls_fail_at_once(restartable):
    c = hostkv.Client(restartable.target, "quick", reconnect_timeout=0)
    restartable.kill()
    start = time.monotonic()
    with pytest.raises(hostkv.errors.Unavailable):
        c.list_pools()
    assert time.monotonic() - start < 1.0
    assert c.probe() is False
    c.close()


def test_the_sglang_host_pool_degrades_while_the_daemon_is_away(restartable):
    device = DevicePool("mha", 2, size=64, page_size=4, dtype=torch.bfloat16)
    host = RemoteMHATokenToKVPoolHost(device, 2.0, 0, 4, "page_first",
                                      target=restartable.target)
    assert host.available_size() > 0
    held = host.alloc(8)
    assert held is not None
    restartable.kill()
    deadline = time.monotonic() + 5
    while not host.client.daemon_away and time.monotonic() < deadline:
        time.sleep(0.02)  # the session socket's hang-up
    # As SGLang's controller asks before a backup: no exception, no backup.
    for _ in range(3):
        assert host.available_size() == 0
        assert host.alloc(4) is None
    # A daemon without the old state: the host pool says so once it answers
    # (at its next ask), naming the cause, instead of hanging.
    restartable.restart("--discard_state")
    time.sleep(0.6)
    with pytest.raises(hostkv.errors.SessionLost) as lost:
        host.alloc(4)
    assert "came back without this session" in lost.value.message
    host.client.close()


def test_storage_answers_misses_and_reconnects(restartable):
    device = DevicePool("mha", 2, size=64, page_size=4, dtype=torch.bfloat16)
    host = InProcessHostPool(device, "page_first")
    storage = make_storage(host, restartable.target)
    tokens = tokens_of(5, 16)
    keys = page_keys(tokens, 4)
    indices = host.alloc(16)
    device.fill_random(torch.Generator().manual_seed(5))
    host.backup_from_device_all_layer(device, indices, torch.arange(16), "kernel")
    assert storage.batch_set_v1(keys, indices) == [True] * 4
    assert storage.batch_exists(keys) == 4
    restartable.kill()
    start = time.monotonic()
    assert storage.batch_exists(keys) == 0          # a miss, not an error
    assert storage.batch_set_v1(keys, indices) == [False] * 4
    assert storage.batch_get_v1(keys, indices) == [False] * 4
    assert time.monotonic() - start < 2.0            # misses come at once
    restartable.restart("--discard_state")
    time.sleep(1.1)  # the storage asks again at most once a second
    # A new session and pool on the new daemon: empty, then stored again.
    assert storage.batch_exists(keys) == 0
    assert storage.batch_set_v1(keys, indices) == [True] * 4
    other = host.alloc(16)
    assert storage.batch_get_v1(keys, other) == [True] * 4
    for page in range(4):
        assert torch.equal(host.get_data_page(int(other[4 * page])),
                           host.get_data_page(int(indices[4 * page])))
    storage.close()
