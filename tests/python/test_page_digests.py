"""No corrupted page reaches an engine: a cached page's bytes changed behind
the daemon's back (through the pool owner's own mapping, across a restart,
in the storage tier's files) make the next lookup miss, with the reason
digest_mismatch or tier_failed, and the page is never served: the lookup
does not return it, the session holds no reference to load or copy it
from, and the key is published again afresh. Against a real hostkvd with
--verify_hits=1.0 (every hit checked before it is returned)."""
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

import hostkv
import prometheus_text
from conftest import Daemon
from hostkv import errors

PAGE = 4


def _pb():
    return hostkv.pb


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pool(c, name, pages):
    c.create_pool(hostkv.mha_pool_spec(name, num_layers=2, num_kv_heads=2, head_dim=8,
                                       page_size=PAGE, capacity_tokens=pages * PAGE))


def _pages(runs):
    return [p for first, n in runs for p in range(first, first + n)]


def _publish_filled(c, pool, namespace, keys, value=0x30):
    """Writes page i full of byte value + i, publishes it under keys[i];
    returns the pages."""
    runs = c.alloc(pool, len(keys) * PAGE)
    size = c.get_pool(pool).page_bytes
    c.write_pages(pool, runs, b"".join(bytes([value + i]) * size for i in range(len(keys))))
    assert c.publish(pool, namespace, keys, runs).cached == len(keys)
    return _pages(runs)


def _stats(c, pool):
    return c.get_pool_stats(pool).pools[0]


def _wait_digests(c, pool, at_least):
    deadline = time.monotonic() + 20
    while True:
        s = _stats(c, pool)
        if s.digests_pending == 0 and s.digests_computed >= at_least:
            return s
        assert time.monotonic() < deadline, s
        time.sleep(0.02)


def _byte_of(c, pool, page):
    """The offset in the pool segment of a byte in the middle of `page`'s V."""
    piece = c.get_page_buffer_meta(pool, [(page, 1)]).pieces[-1]
    return piece.offset + piece.size // 2


def _flip(c, pool, page, mapping, offset=None):
    """Changes one byte of `page` through the owner's writable mapping of
    the pool segment, as a device still writing after a timeout would."""
    offset = _byte_of(c, pool, page) if offset is None else offset
    mapping.bytes_view()[offset] ^= 0x5A


def _cli(daemon, *args):
    cli = os.environ.get("HOSTKV_CLI")
    if not cli:
        pytest.skip("HOSTKV_CLI does not name the hostkv binary")
    out = subprocess.run([cli, f"--target={daemon.target}", *args], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def daemon():
    port = _free_port()
    d = Daemon(f"--metrics_listen=127.0.0.1:{port}", "--verify_hits=1.0")
    d.metrics_url = f"http://127.0.0.1:{port}/metrics"
    yield d
    d.stop()


def test_a_page_changed_through_the_owners_mapping_is_a_miss_never_served(daemon):
    pb = _pb()
    keys = [b"p0", b"p1", b"p2"]
    with hostkv.Client(daemon.target, "engine") as c:
        _pool(c, "flip", 8)
        pages = _publish_filled(c, "flip", "m", keys)
        s = _wait_digests(c, "flip", 3)
        assert c.lookup("flip", "m", keys).hits == 3
        assert _stats(c, "flip").hits_verified == s.hits_verified + 3
        mapping = c.map_pool("flip")
        _flip(c, "flip", pages[1], mapping)
        # The first page is still served; from the changed one on, none.
        found = c.lookup("flip", "m", keys, acquire=True)
        assert found.hits == 1
        assert _pages(found.pages) == [pages[0]]
        # No reference on the changed page: nothing to load or copy it from.
        own = c.alloc("flip", PAGE)
        with pytest.raises(errors.FailedPrecondition):
            c.copy_pages("flip", [(pages[1], 1)], own)
        c.release("flip", found.pages)
        # It left the cache: the next lookups miss it too, saying why.
        assert c.lookup("flip", "m", keys).hits == 1
        why = c.explain_misses("flip", "m", keys, max_recent=5)
        assert why.keys[0].cached and why.keys[2].cached
        assert why.keys[1].reason == pb.MISS_REASON_DIGEST_MISMATCH
        assert 0 <= why.keys[1].dropped_seconds_ago < 60
        assert [m.reason for m in why.recent][:2] == [pb.MISS_REASON_DIGEST_MISMATCH] * 2
        assert why.lookups.digest_mismatch == 2
        stats = _stats(c, "flip")
        assert stats.digest_mismatches == 1
        # The engine recomputes and publishes the key again: served again.
        fresh = _publish_filled(c, "flip", "m", [b"p1"], value=0x31)
        assert fresh != [pages[1]]
        _wait_digests(c, "flip", 4)
        found = c.lookup("flip", "m", keys, acquire=True)
        assert found.hits == 3
        assert _pages(found.pages) == [pages[0], fresh[0], pages[2]]
        size = c.get_pool("flip").page_bytes
        assert c.read_pages("flip", [(fresh[0], 1)]) == bytes([0x31]) * size
        c.release("flip", found.pages)
        out = _cli(daemon, "why", "--pool=flip", "--namespace=m")
        assert "no longer matched the digest" in out
        stats_text = _cli(daemon, "stats", "flip")
        assert "digest mismatch 2" in stats_text
        assert "dropped for a mismatch: 1 on hits" in stats_text


def test_pages_published_and_hit_under_load_all_verify(daemon):
    """Every page of a prompt, published and looked up at once: all hits
    checked (none pending once the worker caught up), none mismatching."""
    with hostkv.Client(daemon.target, "engine") as c:
        _pool(c, "many", 64)
        keys = [b"k%d" % i for i in range(48)]
        _publish_filled(c, "many", "m", keys)
        before = _wait_digests(c, "many", 48)
        for _ in range(3):
            assert c.lookup("many", "m", keys).hits == 48
        s = _stats(c, "many")
        assert s.hits_verified - before.hits_verified == 3 * 48
        assert s.digest_mismatches == 0


def test_prometheus_counts_digest_mismatches(daemon):
    with hostkv.Client(daemon.target, "engine") as c:
        _pool(c, "promd", 4)
        pages = _publish_filled(c, "promd", "m", [b"a"])
        _wait_digests(c, "promd", 1)
        _flip(c, "promd", pages[0], c.map_pool("promd"))
        assert c.lookup("promd", "m", [b"a"]).hits == 0
    body = urllib.request.urlopen(daemon.metrics_url, timeout=10).read().decode()
    families = prometheus_text.parse(body)
    reasons = {}
    for _, labels, value in families["hostkv_cache_missed_lookups_total"]["samples"]:
        reasons[labels["reason"]] = reasons.get(labels["reason"], 0) + value
    assert reasons["digest_mismatch"] >= 1
    assert "tier_failed" in reasons
    found = {}
    for _, labels, value in families["hostkv_page_digest_mismatches_total"]["samples"]:
        found[labels["found"]] = found.get(labels["found"], 0) + value
    assert found["hit"] >= 1
    assert families["hostkv_cache_hits_verified_total"]["type"] == "counter"


def test_a_page_flipped_while_no_daemon_runs_is_not_adopted():
    pb = _pb()
    d = Daemon("--verify_hits=1.0")
    try:
        keys = [b"r0", b"r1", b"r2"]
        c = hostkv.Client(d.target, "engine", reconnect_timeout=30)
        _pool(c, "adopt", 8)
        pages = _publish_filled(c, "adopt", "m", keys)
        _wait_digests(c, "adopt", 3)
        mapping = c.map_pool("adopt")
        offset = _byte_of(c, "adopt", pages[2])
        d.kill()
        # The segment outlives the daemon (the state keeper holds it); the
        # engine's mapping still writes it.
        _flip(c, "adopt", pages[2], mapping, offset)
        d.restart()
        deadline = time.monotonic() + 20
        while True:
            try:
                found = c.lookup("adopt", "m", keys)
                break
            except (errors.Unavailable, errors.NotFound):
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert found.hits == 2
        assert _pages(found.pages) == pages[:2]
        why = c.explain_misses("adopt", "m", keys)
        assert why.keys[2].reason == pb.MISS_REASON_DIGEST_MISMATCH
        stats = _stats(c, "adopt")
        assert stats.adoption_digest_drops == 1
        assert stats.cache.cached_pages == 2
        # The adopted pages kept their digests: checked, and matching.
        assert stats.hits_verified == 2 and stats.hits_unverified == 0
        c.close()
    finally:
        d.stop()


def _tier_files(root):
    out = []
    for base, _, files in os.walk(root):
        out += [os.path.join(base, f) for f in files if f.startswith("k-")]
    return out


@pytest.fixture(scope="module")
def redis_socket():
    """A real redis-server on a unix socket (as test_sglang_storage_tier's)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    workdir = tempfile.mkdtemp(prefix="hostkv-pytest-digest-redis-")
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


class _Redis:
    """Just enough RESP to read and rewrite the values behind the daemon."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.buf = b""

    def call(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else a.encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(out)
        return self._reply()

    def _line(self):
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(1 << 16)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b":":
            return int(rest)
        if kind == b"-":
            raise AssertionError(rest.decode())
        if kind == b"*":
            return [self._reply() for _ in range(int(rest))]
        n = int(rest)
        if n < 0:
            return None
        while len(self.buf) < n + 2:
            self.buf += self.sock.recv(1 << 16)
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data


def _tier_daemon(url):
    return Daemon(f"--tier={url}", "--tier_fsync=false", "--verify_hits=1.0")


def _written(c, count):
    deadline = time.monotonic() + 20
    while True:
        tier = c.get_pool_stats().tier
        if tier.written >= count:
            return tier
        assert time.monotonic() < deadline, tier
        time.sleep(0.02)


def _damage_file_tier(root, damage, keys):
    files = {os.path.basename(p): p for p in _tier_files(root)}
    t1, t2 = files["k-" + keys[1].hex()], files["k-" + keys[2].hex()]
    if damage == "payload":
        with open(t1, "r+b") as f:
            f.seek(40)
            byte = f.read(1)
            f.seek(40)
            f.write(bytes([byte[0] ^ 0xFF]))
    else:
        shutil.copyfile(t2, t1)


def _damage_redis_tier(sock, damage, keys, namespace_len):
    r = _Redis(sock)
    names = r.call("KEYS", "hkv:*")
    # The tier key ends with the cache key (server/tier/redis_tier.cc).
    by_key = {n[-namespace_len:]: n for n in names}
    t1, t2 = by_key[keys[1]], by_key[keys[2]]
    value = r.call("GET", t2 if damage == "other_key" else t1)
    if damage == "payload":
        value = value[:40] + bytes([value[40] ^ 0xFF]) + value[41:]
    assert r.call("SET", t1, value) == b"OK"


@pytest.mark.parametrize("kind", ["file", "redis"])
@pytest.mark.parametrize("damage", ["payload", "other_key"])
def test_a_rewritten_tier_value_is_a_tier_failed_miss(damage, kind, request):
    """A value whose bytes changed in the tier (its frame checksum fails),
    or that holds another key's whole value (frame and checksum intact: the
    key check fails), is not brought in; the lookup misses, tier_failed."""
    pb = _pb()
    tier_dir = tempfile.mkdtemp(prefix="hostkv-pytest-digest-tier-")
    if kind == "redis":
        sock = request.getfixturevalue("redis_socket")
        url = f"redis+unix:{sock}"
    else:
        url = f"file:{tier_dir}"
    keys = [b"%s-%s-t%d" % (kind.encode(), damage.encode(), i) for i in range(3)]
    d = _tier_daemon(url)
    try:
        with hostkv.Client(d.target, "engine") as c:
            _pool(c, "tiered", 4)
            _publish_filled(c, "tiered", "m", keys)
            _written(c, 3)
        d.stop()
        if kind == "redis":
            _damage_redis_tier(sock, damage, keys, len(keys[0]))
        else:
            _damage_file_tier(tier_dir, damage, keys)
        d = _tier_daemon(url)  # a fresh daemon: the tier brings pages in
        with hostkv.Client(d.target, "engine") as c:
            _pool(c, "tiered", 4)
            found = c.lookup("tiered", "m", keys)
            assert found.hits == 1
            why = c.explain_misses("tiered", "m", keys, max_recent=1)
            assert why.keys[0].cached
            assert why.keys[1].reason == pb.MISS_REASON_TIER_FAILED
            assert why.recent[0].reason == pb.MISS_REASON_TIER_FAILED
            assert why.lookups.tier_failed == 1
            stats = _stats(c, "tiered")
            assert stats.tier_values_refused == 1
            assert c.get_pool_stats().tier.read_corrupt == 1
            # The page brought in carries its value's checksum as digest.
            assert stats.digests_computed == 1 and stats.hits_verified >= 1
    finally:
        d.stop()
        shutil.rmtree(tier_dir, ignore_errors=True)
