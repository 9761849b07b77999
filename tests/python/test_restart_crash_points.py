"""hostkvd SIGKILLed at the worst instants (the HOSTKVD_CRASH_AT test hook,
server/operations/crash_point.h) and started again on the same socket: the
state it adopts is consistent (no page both free and cached, no key on a page
whose bytes are not the key's, every free page zeroed before it is handed
out), deploy/README.md "Restarts and upgrades"."""
import os
import threading
import time

import pytest

import hostkv
from conftest import Daemon
from hostkv.cache_calls import CACHED

PAGE_SIZE = 4
PAGES = 8  # the pool's pages, besides SGLang's padding page


@pytest.fixture
def crashing():
    """A daemon that kills itself at HOSTKVD_CRASH_AT; the test sets it."""
    made = []

    def start(point):
        os.environ["HOSTKVD_CRASH_AT"] = point
        try:
            d = Daemon()
        finally:
            del os.environ["HOSTKVD_CRASH_AT"]
        made.append(d)
        return d

    yield start
    for d in made:
        d.stop()


def spec(name="crash"):
    return hostkv.mha_pool_spec(name, 1, 1, 8, PAGE_SIZE,
                                capacity_tokens=PAGES * PAGE_SIZE)


def page_bytes(c, pool):
    return c.get_pool(pool).page_bytes


def fill(c, pool, runs, first_value):
    """Writes page i of `runs` full of byte first_value + i; returns the
    pages in order and their bytes."""
    pages = [p for first, n in runs for p in range(first, first + n)]
    size = page_bytes(c, pool)
    data = b"".join(bytes([(first_value + i) % 256]) * size for i in range(len(pages)))
    c.write_pages(pool, runs, data)
    return pages, data


def wait_dead(d, seconds=10):
    deadline = time.monotonic() + seconds
    while d.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert d.process.poll() is not None, "the daemon did not reach its crash point"
    assert d.process.returncode == -9


def restart(d):
    d.process.wait()
    d.restart()  # without HOSTKVD_CRASH_AT: it was popped from the environment


def check_consistent(d, pool, published):
    """Every key found is on a page holding the key's bytes; every page
    neither cached nor owned comes out of alloc zeroed; the counts add up."""
    with hostkv.Client(d.target, "checker", reconnect_timeout=0) as c:
        size = page_bytes(c, pool)
        found = 0
        for key, data in published.items():
            hit = c.lookup(pool, "ns", [key], acquire=True)
            if hit.hits == 0:
                continue
            found += 1
            assert c.read_pages(pool, hit.pages) == data, key
            c.release(pool, hit.pages)
        stats = c.get_pool_stats(pool).pools[0]
        assert stats.free_pages + stats.used_pages == stats.capacity_pages
        assert stats.cached_pages == found
        free = stats.free_pages
        if free:
            runs = c.alloc(pool, free * PAGE_SIZE)
            assert c.read_pages(pool, runs) == bytes(free * size)
        return found, stats


def publish(c, pool, keys, runs, first_value):
    pages, data = fill(c, pool, runs, first_value)
    size = len(data) // len(pages)
    c.publish(pool, "ns", keys, runs)
    return {k: data[i * size:(i + 1) * size] for i, k in enumerate(keys)}


def restart_once_dead(d):
    """Restarts `d` from a thread once it reached its crash point (the
    test's own call waits for the daemon meanwhile)."""
    def run():
        wait_dead(d)
        restart(d)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def publish_across_the_crash(d, crash_point_reached):
    """An engine publishes 3 keys, then 3 more with the daemon crashing
    inside that Publish; its client waits, resumes and gets the Publish's
    outcome. Returns (published data by key, the second Publish's answer)."""
    c = hostkv.Client(d.target, "engine", reconnect_timeout=30)
    c.create_pool(spec())
    published = publish(c, "crash", [b"k0", b"k1", b"k2"], c.alloc("crash", 3 * PAGE_SIZE), 10)
    second = c.alloc("crash", 3 * PAGE_SIZE)
    pages, data = fill(c, "crash", second, 50)
    size = len(data) // len(pages)
    restarter = restart_once_dead(d)
    done = c.publish("crash", "ns", [b"k3", b"k4", b"k5"], second)
    restarter.join()
    assert crash_point_reached(d)
    published.update({b"k3": data[:size], b"k4": data[size:2 * size], b"k5": data[2 * size:]})
    return c, published, done, pages


def test_killed_between_taking_the_pages_and_recording_their_keys(crashing):
    d = crashing("publish:2")
    c, published, done, pages = publish_across_the_crash(d, lambda d: True)
    # The pages went back to the session (its ledger said it was publishing
    # them and no key was recorded); the Publish sent again cached them.
    assert done.outcomes == [CACHED] * 3 and done.cached == 3
    assert done.pages == pages and done.uncached_pages == []
    found, stats = check_consistent(d, "crash", published)
    assert found == 6
    r = c.get_pool_stats("crash").restart
    assert r.adopted and r.cached_pages_adopted == 3 and r.pages_dropped == 0
    assert stats.used_pages == 6  # nothing orphaned, nothing lost
    c.close()


def test_killed_in_the_middle_of_a_publishs_keys(crashing):
    d = crashing("publish_item:5")
    c, published, done, pages = publish_across_the_crash(d, lambda d: True)
    # k3 and k4 were recorded before the crash, k5 was not: the Publish sent
    # again finds the first two cached as it asked and caches the third.
    assert done.outcomes == [CACHED] * 3 and done.pages == pages
    found, stats = check_consistent(d, "crash", published)
    assert found == 6
    r = c.get_pool_stats("crash").restart
    assert r.cached_pages_adopted == 5 and r.pages_dropped == 0
    assert stats.used_pages == 6
    c.close()


def test_a_publish_sent_again_after_a_restart_acquires_as_it_asked(crashing):
    d = crashing("publish_item:5")
    c = hostkv.Client(d.target, "engine", reconnect_timeout=30)
    c.create_pool(spec())
    publish(c, "crash", [b"k0", b"k1", b"k2"], c.alloc("crash", 3 * PAGE_SIZE), 10)
    second = c.alloc("crash", 3 * PAGE_SIZE)
    fill(c, "crash", second, 50)
    restarter = restart_once_dead(d)
    done = c.publish("crash", "ns", [b"k3", b"k4", b"k5"], second, acquire=True)
    restarter.join()
    assert done.cached == 3
    # One reference per item, whichever try cached it: releasing them all
    # works once and only once.
    assert c.release("crash", second) == 3
    with pytest.raises(hostkv.errors.FailedPrecondition):
        c.release("crash", second)
    c.close()


def test_killed_after_zeroing_freed_pages_before_recording_it(crashing):
    d = crashing("scrub:1")
    c = hostkv.Client(d.target, "engine", reconnect_timeout=0)
    c.create_pool(spec())
    runs = c.alloc("crash", PAGES * PAGE_SIZE)
    fill(c, "crash", runs, 1)
    try:
        c.free("crash", runs)
    except hostkv.errors.Unavailable:
        pass  # the scrubber may crash the daemon before free answers
    wait_dead(d)
    restart(d)
    found, stats = check_consistent(d, "crash", {})
    assert found == 0
    # The freeing session's pages were freed before the crash (the ledger
    # said so first); none is owned now, and all came back zeroed.
    assert stats.free_pages == stats.capacity_pages


def test_killed_in_the_middle_of_an_eviction(crashing):
    d = crashing("evict:1")
    c = hostkv.Client(d.target, "engine", reconnect_timeout=0)
    c.create_pool(spec())
    capacity = c.get_pool_stats("crash").pools[0].capacity_pages
    keys = [b"e%d" % i for i in range(capacity)]
    published = publish(c, "crash", keys, c.alloc("crash", capacity * PAGE_SIZE), 100)
    with pytest.raises(hostkv.errors.Unavailable):
        c.alloc("crash", 2 * PAGE_SIZE)  # evicts the coldest page
    wait_dead(d)
    restart(d)
    found, stats = check_consistent(d, "crash", published)
    assert found == capacity - 1  # the victim's key went, its page zeroed
    assert stats.free_pages == 1
