"""Session lifetime: a killed client's pages come back; TCP with a token."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import hostkv
from hostkv import errors
from conftest import Daemon

CHILD = textwrap.dedent("""
    import sys, time
    import hostkv
    c = hostkv.Client(sys.argv[1], "doomed")
    c.create_pool(hostkv.mha_pool_spec("killed", num_layers=1, num_kv_heads=1,
                                       head_dim=8, page_size=4, capacity_tokens=64))
    c.alloc("killed", 32)
    print(c.session_number, flush=True)
    time.sleep(600)
""")


def used_pages(client, pool):
    (s,) = client.get_pool_stats(pool).pools
    return s.used_pages


def test_sigkilled_client_has_its_session_reclaimed(daemon, client):
    child = subprocess.Popen([sys.executable, "-c", CHILD, daemon.target],
                             stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        number = int(child.stdout.readline())
        assert used_pages(client, "killed") == 8
        child.send_signal(signal.SIGKILL)
        child.wait()
        deadline = time.monotonic() + 5
        while used_pages(client, "killed") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert used_pages(client, "killed") == 0
        numbers = [s.session_number for s in client.get_pool_stats().sessions]
        assert number not in numbers
    finally:
        if child.poll() is None:
            child.kill()
    client.delete_pool("killed")


TOKEN = "py-s3cret"


@pytest.fixture(scope="module")
def tcp_daemon():
    d = Daemon("--session_lease=3s", tcp=True, token=TOKEN)
    yield d
    d.stop()


def test_tcp_with_token_renews_its_lease(tcp_daemon):
    with hostkv.Client(tcp_daemon.target, "tcp-client", auth_token=TOKEN) as c:
        pool = c.create_pool(hostkv.mha_pool_spec(
            "tcp", num_layers=1, num_kv_heads=1, head_dim=8, page_size=4,
            capacity_tokens=32))
        pages = c.alloc("tcp", 8)
        data = os.urandom(2 * pool.page_bytes)
        c.write_pages("tcp", pages, data)
        time.sleep(4.5)  # past the 3 s lease: only the renewals keep it
        assert c.read_pages("tcp", pages) == data
        with pytest.raises(errors.FailedPrecondition):
            c.pass_descriptor(0)  # no session socket over TCP
        with pytest.raises(errors.FailedPrecondition):
            c.on_daemon_lost(print)
        with pytest.raises(errors.FailedPrecondition):
            c.map_pool("tcp")
        c.free("tcp", pages)
        c.delete_pool("tcp")


def test_tcp_without_token(tcp_daemon):
    with pytest.raises(errors.Unauthenticated):
        hostkv.Client(tcp_daemon.target, "no-token")
    with pytest.raises(errors.Unauthenticated):
        hostkv.Client(tcp_daemon.target, "wrong-token", auth_token="nope")


def test_close_frees_and_is_idempotent(daemon, client):
    client.create_pool(hostkv.mha_pool_spec("closing", num_layers=1, num_kv_heads=1,
                                            head_dim=8, page_size=4, capacity_tokens=64))
    other = hostkv.Client(daemon.target, "closer")
    other.alloc("closing", 16)
    assert used_pages(client, "closing") == 4
    other.close()
    other.close()
    with pytest.raises(errors.FailedPrecondition):
        other.alloc("closing", 4)
    assert used_pages(client, "closing") == 0
    client.delete_pool("closing")


def test_on_daemon_lost_runs_when_the_daemon_dies_not_on_close():
    d = Daemon()
    try:
        closed_calls, lost_calls = [], threading.Event()
        with hostkv.Client(d.target, "closing") as c:
            c.on_daemon_lost(lambda: closed_calls.append(1))
        watched = hostkv.Client(d.target, "watched")
        watched.on_daemon_lost(lost_calls.set)
        d.process.kill()
        d.process.wait()
        assert lost_calls.wait(30)
        assert closed_calls == []
        assert watched.daemon_away
        watched.close()  # the daemon is gone, and the session with it: no error
    finally:
        d.stop()



FORKED = textwrap.dedent("""
    import os, sys
    import hostkv
    c = hostkv.Client(sys.argv[1], "parent")
    c.create_pool(hostkv.mha_pool_spec("forked", num_layers=1, num_kv_heads=1,
                                       head_dim=8, page_size=4, capacity_tokens=64))
    if os.fork() == 0:
        sys.exit(0)  # the child's exit runs atexit: it must leave the parent's session be
    os.wait()
    print(len(c.alloc("forked", 8)), flush=True)
    c.close()
""")


def test_forked_child_leaves_the_parents_session_open(daemon):
    out = subprocess.run([sys.executable, "-c", FORKED, daemon.target], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "1"  # one run: the parent's session still serves
