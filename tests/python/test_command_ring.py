"""The command ring (proto/contract/command_ring.h) from Python against a
real hostkvd: the hot calls go through it, answer as gRPC does, survive a
daemon restart, and a client scribbling over its ring harms nobody."""
import ctypes
import mmap
import os
import random
import threading
import time

import pytest

import hostkv
from hostkv import _command_ring, _session_socket
from conftest import Daemon

pytestmark = pytest.mark.skipif(not _command_ring.SUPPORTED,
                                reason="the Python ring runs on x86-64 only")


def make_pool(client, name, capacity=256):
    spec = hostkv.mha_pool_spec(name, num_layers=2, num_kv_heads=2, head_dim=8, page_size=4,
                                capacity_tokens=capacity)
    return client.create_pool(spec, delete_with_session=True)


def test_hot_calls_go_through_the_ring(daemon):
    with hostkv.Client(daemon.target, "ring") as c:
        assert c.uses_command_ring
        make_pool(c, "ring-hot")
        before = c.command_ring_calls
        pages = c.alloc("ring-hot", 16)
        assert hostkv.count_tokens(pages, 4) == 16
        assert c.free("ring-hot", pages) == 4
        hits, _ = c.lookup("ring-hot", "ns", [b"k0", b"k1"])
        assert hits == 0
        assert c.command_ring_calls == before + 3
        # Calls that are not hot stay on gRPC.
        c.get_pool_stats("ring-hot")
        assert c.command_ring_calls == before + 3


def test_ring_and_grpc_answer_alike(daemon):
    with hostkv.Client(daemon.target, "ring") as ring, \
            hostkv.Client(daemon.target, "grpc", command_ring=False) as plain:
        assert not plain.uses_command_ring and plain.command_ring_calls == -1
        make_pool(ring, "ring-alike")
        failures = []
        for c in (ring, plain):
            with pytest.raises(hostkv.errors.HostKVError) as e:
                c.alloc("no-such-pool", 4)
            failures.append((type(e.value), e.value.message))
            with pytest.raises(hostkv.errors.HostKVError) as e:
                c.free("ring-alike", [(1000, 1)])
            failures.append((type(e.value), e.value.message))
        assert failures[0] == failures[2] and failures[1] == failures[3], failures
        # One session's pages are not the other's, whichever way it calls.
        pages = ring.alloc("ring-alike", 8)
        with pytest.raises(hostkv.errors.FailedPrecondition):
            plain.free("ring-alike", pages)
        assert ring.free("ring-alike", pages) == 2


def test_tcp_clients_use_grpc():
    d = Daemon(tcp=True, token="t0ken")
    try:
        with hostkv.Client(d.target, "tcp", auth_token="t0ken") as c:
            assert not c.uses_command_ring
    finally:
        d.stop()


def test_threads_share_one_ring(daemon):
    with hostkv.Client(daemon.target, "ring") as c:
        make_pool(c, "ring-threads", capacity=1024)
        errors = []

        def churn():
            try:
                for _ in range(100):
                    c.free("ring-threads", c.alloc("ring-threads", 8))
            except Exception as e:  # pylint: disable=broad-except
                errors.append(e)

        threads = [threading.Thread(target=churn) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert c.get_pool_stats("ring-threads").pools[0].used_pages == 0


def test_a_killed_daemon_is_noticed_during_a_ring_call():
    d = Daemon()
    try:
        c = hostkv.Client(d.target, "ring", reconnect_timeout=0)
        assert c.uses_command_ring
        make_pool(c, "ring-kill")
        d.kill()
        start = time.monotonic()
        with pytest.raises(hostkv.errors.Unavailable):
            c.alloc("ring-kill", 4)
        assert time.monotonic() - start < 5
        c.close()
    finally:
        d.stop()


def test_the_ring_comes_back_after_a_restart():
    d = Daemon()
    try:
        with hostkv.Client(d.target, "ring") as c:
            make_pool(c, "ring-restart")
            pages = c.alloc("ring-restart", 8)
            d.kill()
            d.restart()
            # The call waits for the daemon, resumes the session, and goes
            # through the new daemon's ring.
            more = c.alloc("ring-restart", 8)
            assert c.uses_command_ring and c.command_ring_calls >= 1
            assert c.free("ring-restart", pages + more) == 4
    finally:
        d.stop()


def test_a_client_scribbling_over_its_ring_harms_nobody(daemon):
    """A hostile process maps its own ring and writes random bytes over all
    of it (header, doorbell, slot states, lengths, payloads), ringing the
    doorbell, while an honest client works: the daemon lives, the honest
    client's calls are right, and the hostile session's pool is intact."""
    with hostkv.Client(daemon.target, "honest") as honest:
        make_pool(honest, "ring-honest", capacity=1024)
        sock = _session_socket.connect(daemon.sock)
        try:
            _session_socket.exchange(sock, _session_socket.message(
                _session_socket.KIND_OPEN, client_name=b"hostile"))
            reply = _session_socket.exchange(sock, _session_socket.message(
                _session_socket.KIND_OPEN_COMMAND_RING))
            size = reply.value
            mm = mmap.mmap(reply.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            os.close(reply.fd)
            rng = random.Random(7)
            stop = threading.Event()
            doorbell = ctypes.c_uint32.from_buffer(mm, 16)
            doorbell_addr = ctypes.c_void_p(ctypes.addressof(doorbell))

            def scribble():
                while not stop.is_set():
                    offset = rng.randrange(0, size - 64)
                    mm[offset:offset + 64] = rng.randbytes(64)
                    # A slot header made to look submitted, with any method
                    # and length.
                    slot = 64 + rng.randrange(0, 8) * (256 * 1024)
                    mm[slot + 4:slot + 12] = rng.randbytes(8)
                    mm[slot:slot + 4] = (1).to_bytes(4, "little")
                    doorbell.value = rng.randrange(0, 1 << 32)
                    _command_ring._libc.syscall(_command_ring._SYS_FUTEX, doorbell_addr, 1,
                                                0x7FFFFFFF, None, None, 0)

            hostile = threading.Thread(target=scribble)
            hostile.start()
            try:
                for i in range(200):
                    pages = honest.alloc("ring-honest", 16)
                    assert hostkv.count_tokens(pages, 4) == 16
                    assert honest.free("ring-honest", pages) == 4
            finally:
                stop.set()
                hostile.join()
            del doorbell
            mm.close()
        finally:
            sock.close()
        assert daemon.process.poll() is None
        stats = honest.get_pool_stats("ring-honest").pools[0]
        assert stats.used_pages == 0
