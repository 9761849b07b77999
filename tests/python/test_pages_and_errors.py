"""Alloc/free accounting, errors (the right class, nothing changed), threads."""
import os
import threading

import pytest

import hostkv
from hostkv import errors

PAGE = 4


@pytest.fixture
def pool(client):
    spec = hostkv.mha_pool_spec("acct", num_layers=2, num_kv_heads=1, head_dim=8,
                                page_size=PAGE, capacity_tokens=60)
    p = client.create_pool(spec)
    yield p
    client.delete_pool("acct")


def stats(client):
    (s,) = client.get_pool_stats("acct").pools
    return s


def mine(client):
    return {u.session_number: u.pages for u in stats(client).sessions}.get(
        client.session_number, 0)


def test_alloc_free_accounting(client, pool):
    capacity = pool.num_pages
    assert stats(client).free_pages == capacity and stats(client).used_pages == 0
    a = client.alloc("acct", 12)
    b = client.alloc("acct", 8)
    assert stats(client).used_pages == 5 and mine(client) == 5
    assert stats(client).free_pages == capacity - 5
    assert client.free("acct", a) == 3
    assert stats(client).used_pages == 2
    assert client.free("acct", b) == 2
    assert stats(client).used_pages == 0 and mine(client) == 0


def test_errors_raise_their_class_and_change_nothing(client, pool):
    pages = client.alloc("acct", 8)
    before = stats(client).used_pages
    with pytest.raises(errors.NotFound):
        client.get_pool("no-such-pool")
    with pytest.raises(errors.NotFound):
        client.alloc("no-such-pool", 4)
    with pytest.raises(errors.InvalidArgument):
        client.alloc("acct", 3)  # not a multiple of the page size
    with pytest.raises(errors.ResourceExhausted) as full:
        client.alloc("acct", 4 * pool.num_pages)
    assert full.value.message and full.value.code == 8
    assert isinstance(full.value, hostkv.HostKVError)
    first = pages[0][0]
    with pytest.raises(errors.FailedPrecondition):
        client.free("acct", [(first, 1), (first, 1)])  # twice: all or nothing
    with pytest.raises(errors.FailedPrecondition):
        client.delete_pool("acct")  # pages allocated
    with pytest.raises(errors.InvalidArgument):
        client.write_pages("acct", pages, b"short")
    assert stats(client).used_pages == before
    assert client.free("acct", pages) == 2
    with pytest.raises(errors.FailedPrecondition):
        client.free("acct", pages)  # already free


def test_session_socket_errors_map_too(client):
    # An unsealed memfd: the session socket's reply carries InvalidArgument.
    fd = os.memfd_create("unsealed", os.MFD_CLOEXEC)
    os.ftruncate(fd, 4096)
    try:
        with pytest.raises(errors.InvalidArgument):
            client.pass_descriptor(fd)
    finally:
        os.close(fd)
    with hostkv.shm.SealedBuffer(4096) as buf:
        assert client.pass_descriptor(buf.fd) >= 0


def test_client_name_too_long(daemon):
    with pytest.raises(errors.InvalidArgument):
        hostkv.Client(daemon.target, "x" * 224)


def test_no_daemon():
    with pytest.raises(errors.Unavailable):
        hostkv.Client("unix:/nonexistent/hostkvd.sock", "nobody")


def test_two_threads_at_once(client, pool):
    failures = []

    page_bytes = pool.page_bytes

    def churn(seed):
        try:
            for i in range(40):
                pages = client.alloc("acct", 8)
                data = bytes([seed, i]) * page_bytes
                client.write_pages("acct", pages, data)
                if i % 5 == 0:  # a session may pass 64 descriptors in all
                    with hostkv.shm.SealedBuffer(4096) as buf:
                        client.pass_descriptor(buf.fd)
                assert client.read_pages("acct", pages) == data
                assert client.free("acct", pages) == 2
        except Exception as e:  # pylint: disable=broad-except
            failures.append(e)

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert stats(client).used_pages == 0


def test_hand_over_pages(daemon, client, pool):
    with hostkv.Client(daemon.target, "successor") as other:
        pages = client.alloc("acct", 8)
        assert client.hand_over_pages("acct", pages, other.session_number) == 2
        with pytest.raises(errors.FailedPrecondition):
            client.free("acct", pages)
        assert other.free("acct", pages) == 2
