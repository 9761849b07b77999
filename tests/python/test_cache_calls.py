"""The page cache through hostkv.Client: publish, lookup, release,
copy_pages against a real hostkvd; bytes compared through ReadPages, counts
through GetPoolStats, errors by class."""
import itertools

import pytest

import hostkv
from hostkv import cache_calls, errors

PAGE = 4
_names = itertools.count()


@pytest.fixture(scope="module")
def pool(daemon):
    """One named pool for the module (each test its own namespace)."""
    with hostkv.Client(daemon.target, "pool-maker") as c:
        c.create_pool(hostkv.mha_pool_spec("cache-calls", num_layers=2, num_kv_heads=1,
                                           head_dim=8, page_size=PAGE,
                                           capacity_tokens=512))
    return "cache-calls"


@pytest.fixture
def namespace():
    return f"test/ns{next(_names)}"


PAGE_BYTES = 2 * 2 * PAGE * 1 * 8 * 2  # K and V, 2 layers, PAGE tokens, 1 x 8 bf16


def fill(client, pool, runs, seed):
    """Writes a distinct pattern into each page of `runs`; returns the bytes."""
    total = PAGE_BYTES * sum(n for _, n in runs)
    data = bytes((seed * 31 + i) % 251 for i in range(total))
    client.write_pages(pool, runs, data)
    return data


def pool_stats(client, pool):
    (s,) = client.get_pool_stats(pool).pools
    return s


def test_publish_then_lookup_finds_the_longest_prefix(client, pool, namespace):
    runs = client.alloc(pool, 4 * PAGE)
    data = fill(client, pool, runs, seed=1)
    keys = [b"k0", b"k1", b"k2", b"k3"]
    before = pool_stats(client, pool)
    done = client.publish(pool, namespace, keys, runs, parent_keys=[None] + keys[:-1])
    assert done.cached == 4 and done.already_cached == 0
    assert done.outcomes == [cache_calls.CACHED] * 4
    assert done.pages == cache_calls.page_list(runs) and done.uncached_pages == []
    assert client.lookup(pool, namespace, keys) == (4, runs)
    hits, pages = client.lookup(pool, namespace, [b"k0", b"k1", b"nope", b"k3"])
    assert hits == 2 and cache_calls.page_list(pages) == cache_calls.page_list(runs)[:2]
    assert client.lookup(pool, namespace, [b"nope", b"k0"]) == (0, [])
    # A str key is its utf-8 bytes.
    assert client.lookup(pool, namespace, ["k0", "k1"]).hits == 2
    # Published pages are the cache's: counted as cached, no longer this session's.
    s = pool_stats(client, pool)
    assert s.cached_pages == before.cached_pages + 4
    assert s.used_pages == before.used_pages  # the same pages, now the cache's
    assert {u.session_number: u.pages for u in s.sessions}.get(client.session_number, 0) == 0
    with pytest.raises(errors.FailedPrecondition):
        client.free(pool, runs)
    # Read back (with references) the bytes that were published.
    hits, cached = client.lookup(pool, namespace, keys, acquire=True)
    assert client.read_pages(pool, cached) == data
    assert client.release(pool, cached) == 4


def test_a_lookup_elsewhere_finds_nothing(client, pool, namespace):
    runs = client.alloc(pool, PAGE)
    client.publish(pool, namespace, [b"only"], runs)
    assert client.lookup(pool, namespace + "-other", [b"only"]) == (0, [])
    assert client.lookup(pool, namespace, [b"only"]).hits == 1


def test_references_are_counted_and_released_all_or_nothing(client, pool, namespace):
    runs = client.alloc(pool, 2 * PAGE)
    client.publish(pool, namespace, [b"a", b"b"], runs)
    _, once = client.lookup(pool, namespace, [b"a", b"b"], acquire=True)
    _, twice = client.lookup(pool, namespace, [b"a"], acquire=True)
    assert pool_stats(client, pool).cache.referenced_pages == 2  # pages, not references
    assert client.release(pool, twice) == 1
    assert client.release(pool, once) == 2
    with pytest.raises(errors.FailedPrecondition):
        client.release(pool, once)  # none left: releases nothing
    assert pool_stats(client, pool).cache.referenced_pages == 0


def test_a_key_cached_already_keeps_its_page(client, daemon, pool, namespace):
    first = client.alloc(pool, PAGE)
    data = fill(client, pool, first, seed=2)
    client.publish(pool, namespace, [b"same"], first)
    with hostkv.Client(daemon.target, "second-engine") as other:
        mine = other.alloc(pool, 2 * PAGE)
        fill(other, pool, mine, seed=3)
        done = other.publish(pool, namespace, [b"same", b"new"], mine)
        assert done.outcomes == [cache_calls.ALREADY_CACHED, cache_calls.CACHED]
        assert done.cached == 1 and done.already_cached == 1
        assert done.pages[0] == first[0][0]
        assert done.uncached_pages == [(mine[0][0], 1)]
        assert other.free(pool, done.uncached_pages) == 1  # still its own
        hits, cached = other.lookup(pool, namespace, [b"same"], acquire=True)
        assert other.read_pages(pool, cached) == data
        other.release(pool, cached)


def test_cached_pages_outlive_their_publisher(daemon, pool, namespace):
    with hostkv.Client(daemon.target, "publisher") as publisher:
        runs = publisher.alloc(pool, 3 * PAGE)
        data = fill(publisher, pool, runs, seed=4)
        publisher.publish(pool, namespace, [b"x", b"y", b"z"], runs)
    with hostkv.Client(daemon.target, "reader") as reader:
        hits, cached = reader.lookup(pool, namespace, [b"x", b"y", b"z"], acquire=True)
        assert hits == 3 and reader.read_pages(pool, cached) == data
        assert reader.release(pool, cached) == 3


def test_copy_pages_from_cached_and_owned_pages(client, pool, namespace):
    runs = client.alloc(pool, 2 * PAGE)
    data = fill(client, pool, runs, seed=5)
    client.publish(pool, namespace, [b"c0", b"c1"], runs)
    _, cached = client.lookup(pool, namespace, [b"c0", b"c1"], acquire=True)
    mine = client.alloc(pool, 2 * PAGE)
    assert client.copy_pages(pool, cached, mine) == 2
    client.release(pool, cached)
    assert client.read_pages(pool, mine) == data
    # Owned -> owned, page order kept: page i -> page i.
    more = client.alloc(pool, 2 * PAGE)
    pages = cache_calls.page_list(mine)
    assert client.copy_pages(pool, [(pages[1], 1), (pages[0], 1)], more) == 2
    half = len(data) // 2
    assert client.read_pages(pool, more) == data[half:] + data[:half]


def test_copy_pages_refuses_what_the_session_may_not_touch(client, daemon, pool, namespace):
    runs = client.alloc(pool, PAGE)
    client.publish(pool, namespace, [b"ref"], runs)
    mine = client.alloc(pool, 3 * PAGE)
    pages = cache_calls.page_list(mine)
    with pytest.raises(errors.FailedPrecondition):  # cached, not referenced
        client.copy_pages(pool, runs, [(pages[0], 1)])
    with pytest.raises(errors.FailedPrecondition):  # into a cached page
        client.copy_pages(pool, [(pages[0], 1)], runs)
    with pytest.raises(errors.InvalidArgument):  # unequal totals
        client.copy_pages(pool, [(pages[0], 1)], [(pages[1], 1), (pages[2], 1)])
    with hostkv.Client(daemon.target, "stranger") as other:
        with pytest.raises(errors.FailedPrecondition):  # another session's pages
            other.copy_pages(pool, [(pages[0], 1)], [(pages[1], 1)])


def test_publish_errors_change_nothing(client, daemon, pool, namespace):
    runs = client.alloc(pool, 2 * PAGE)
    before = pool_stats(client, pool).cached_pages
    with hostkv.Client(daemon.target, "stranger") as other:
        with pytest.raises(errors.FailedPrecondition):  # the pages are not its own
            other.publish(pool, namespace, [b"p0", b"p1"], runs)
    with pytest.raises(errors.InvalidArgument):  # pages past the pool's end
        client.publish(pool, namespace, [b"far"], [(10_000, 1)])
    with pytest.raises(errors.InvalidArgument):
        client.publish(pool, "", [b"p0", b"p1"], runs)  # no namespace
    with pytest.raises(errors.InvalidArgument):
        client.publish(pool, "n" * 129, [b"p0", b"p1"], runs)
    with pytest.raises(errors.NotFound):
        client.publish("no-such-pool", namespace, [b"p0", b"p1"], runs)
    assert pool_stats(client, pool).cached_pages == before
    assert client.lookup(pool, namespace, [b"p0"]).hits == 0
    assert client.free(pool, runs) == 2  # still the session's


def test_unknown_pages_are_refused(client, pool):
    with pytest.raises(errors.FailedPrecondition):  # free pages: no references
        client.release(pool, [(0, 1)])
    with pytest.raises(errors.InvalidArgument):
        client.release(pool, [(10_000, 1)])


@pytest.mark.parametrize("bad", [b"", "", b"x" * 65, "é" * 33, 7, None])
def test_bad_keys_raise_invalid_argument_before_sending(client, pool, namespace, bad):
    runs = client.alloc(pool, PAGE)
    with pytest.raises(errors.InvalidArgument):
        client.publish(pool, namespace, [bad], runs)
    with pytest.raises(errors.InvalidArgument):
        client.lookup(pool, namespace, [b"fine", bad])
    with pytest.raises(errors.InvalidArgument):
        client.publish(pool, namespace, [b"fine"], runs, parent_keys=[bad or b"x" * 65])
    assert client.free(pool, runs) == 1


def test_the_daemon_checks_keys_too(client, pool, namespace):
    """The checks are the daemon's as well: a raw request with a 65-byte key."""
    stub = client._stub  # pylint: disable=protected-access
    request = hostkv.pb.LookupRequest(session_id=client.session_id, pool=pool,
                                      namespace=namespace, keys=[b"x" * 65])
    with pytest.raises(errors.InvalidArgument):
        client._call(stub.Lookup, request)  # pylint: disable=protected-access


def test_key_and_page_counts_must_agree(client, pool, namespace):
    runs = client.alloc(pool, 2 * PAGE)
    with pytest.raises(errors.InvalidArgument):
        client.publish(pool, namespace, [b"one"], runs)
    with pytest.raises(errors.InvalidArgument):
        client.publish(pool, namespace, [b"a", b"b"], runs, parent_keys=[None])
    assert client.free(pool, runs) == 2


def test_cache_key_rules():
    assert cache_calls.cache_key("k") == b"k"
    assert cache_calls.cache_key(bytearray(b"\x00\xff")) == b"\x00\xff"
    assert cache_calls.cache_key(b"x" * 64) == b"x" * 64
    assert cache_calls.page_runs([3, 4, 5, 9, 2]) == [(3, 3), (9, 1), (2, 1)]
    assert cache_calls.page_list([(3, 3), (9, 1)]) == [3, 4, 5, 9]


def test_one_page_under_two_keys_is_a_conflict(client, pool, namespace):
    (first, _), = client.alloc(pool, PAGE)
    done = client.publish(pool, namespace, [b"one", b"two"], [(first, 1), (first, 1)])
    assert done.outcomes == [cache_calls.CACHED, cache_calls.CONFLICT]
    assert done.pages == [first, first] and done.cached == 1
    assert done.uncached_pages == []  # the page is the cache's
    assert client.lookup(pool, namespace, [b"one"]).hits == 1


def test_publish_with_acquire_holds_the_pages(client, pool, namespace):
    runs = client.alloc(pool, 2 * PAGE)
    before = pool_stats(client, pool).cache.referenced_pages
    client.publish(pool, namespace, [b"h0", b"h1"], runs, acquire=True)
    assert pool_stats(client, pool).cache.referenced_pages == before + 2
    assert client.release(pool, runs) == 2
    assert pool_stats(client, pool).cache.referenced_pages == before
