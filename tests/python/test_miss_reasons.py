"""Every miss has a reason: each one produced by a real scenario against a
real daemon, read back the ways users read it: ExplainMisses (the Python
client), `hostkv why` and `hostkv stats` (the CLI operators run) and
/metrics (Prometheus text)."""
import os
import socket
import subprocess
import urllib.request

import pytest

import hostkv
import prometheus_text
from conftest import Daemon

PAGE = 4


def _pb():
    return hostkv.pb


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def daemon():
    port = _free_port()
    d = Daemon(f"--metrics_listen=127.0.0.1:{port}", "--max_cache_refs_per_session=6")
    d.metrics_url = f"http://127.0.0.1:{port}/metrics"
    yield d
    d.stop()


def _pool(c, name, pages):
    c.create_pool(hostkv.mha_pool_spec(name, num_layers=1, num_kv_heads=1, head_dim=8,
                                       page_size=PAGE, capacity_tokens=pages * PAGE))


def _publish(c, pool, namespace, keys):
    pages = c.alloc(pool, len(keys) * PAGE)
    assert c.publish(pool, namespace, keys, pages).cached == len(keys)


def _cli(daemon, *args):
    cli = os.environ.get("HOSTKV_CLI")
    if not cli:
        pytest.skip("HOSTKV_CLI does not name the hostkv binary")
    out = subprocess.run([cli, f"--target={daemon.target}", *args], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_each_reason_from_its_scenario(daemon):
    from hostkv import errors
    with hostkv.Client(daemon.target, "engine-a") as a, \
            hostkv.Client(daemon.target, "engine-b") as b:
        _pool(a, "why", 8)
        _publish(a, "why", "model/a", [b"k0", b"k1", b"k2"])
        _publish(a, "why", "model/b", [b"seeded"])
        # never published here
        assert a.lookup("why", "model/a", [b"k0", b"nope"]).hits == 1
        # published in another namespace of the pool (another hash seed,
        # another hostkv_namespace text)
        assert a.lookup("why", "model/a", [b"seeded"]).hits == 0
        # evicted, for engine-b's allocation of every page of the pool
        capacity = a.get_pool("why").token_slots // PAGE
        b.free("why", b.alloc("why", capacity * PAGE))
        assert a.lookup("why", "model/a", [b"k0"]).hits == 0
        # refused: past --max_cache_refs_per_session (6)
        _publish(a, "why", "model/a", [b"r0", b"r1"])
        a.lookup("why", "model/a", [b"r0", b"r1"], acquire=True)
        a.lookup("why", "model/a", [b"r0", b"r1"], acquire=True)
        a.lookup("why", "model/a", [b"r0", b"r1"], acquire=True)
        with pytest.raises(errors.ResourceExhausted):
            a.lookup("why", "model/a", [b"r0", b"r1"], acquire=True)
        pb = _pb()
        why = a.explain_misses("why", "model/a", [b"k0", b"nope", b"seeded", b"r0"],
                               max_recent=10)
        number_b = b.session_number
        k0, nope, seeded, r0 = why.keys
        assert k0.reason == pb.MISS_REASON_EVICTED and not k0.cached
        assert k0.evicted_for_session == number_b
        assert 0 <= k0.evicted_seconds_ago < 60
        assert nope.reason == pb.MISS_REASON_NEVER_PUBLISHED
        assert seeded.reason == pb.MISS_REASON_OTHER_NAMESPACE
        assert seeded.other_namespace == "model/b"
        assert r0.cached
        assert [m.reason for m in why.recent] == [
            pb.MISS_REASON_REFUSED, pb.MISS_REASON_EVICTED, pb.MISS_REASON_OTHER_NAMESPACE,
            pb.MISS_REASON_NEVER_PUBLISHED]
        assert [m.key for m in why.recent][1:] == [b"k0", b"seeded", b"nope"]
        c = why.lookups
        assert (c.never_published, c.evicted, c.other_namespace, c.refused) == (1, 1, 1, 1)
        assert c.missed_lookups == 4
        # lookups: 3 with a miss, 3 acquired hits, 1 refused
        assert c.lookups == 7 and c.reusable_lookups == 6  # "seeded" never could
        assert why.hint == ""
        assert all(m.seconds_ago >= 0 for m in why.recent)
        stats = a.get_pool_stats("why").pools[0]
        ns = {n.name: n for n in stats.cache_namespaces}
        assert ns["model/a"].lookups == c


def test_lookups_and_publishes_that_never_meet_get_a_hint(daemon):
    with hostkv.Client(daemon.target, "engine") as c:
        _pool(c, "seeds", 16)
        # Two engines of one model whose page hashes differ (vLLM without
        # PYTHONHASHSEED): one publishes, the other looks up, never a hit.
        _publish(c, "seeds", "llama", [b"seed-1:%d" % i for i in range(4)])
        for i in range(3):
            assert c.lookup("seeds", "llama", [b"seed-2:%d" % i]).hits == 0
        why = c.explain_misses("seeds", "llama")
        assert "no key looked up here was ever published here" in why.hint
        assert "PYTHONHASHSEED" in why.hint
        out = _cli(daemon, "why", "--pool=seeds", "--namespace=llama",
                   (b"seed-1:0").hex(), (b"seed-2:0").hex())
        assert "no key looked up here was ever published here" in out
        assert f"{(b'seed-1:0').hex()}: cached" in out
        assert f"{(b'seed-2:0').hex()}: never published in this namespace" in out
        assert "latest misses:" in out
        stats = _cli(daemon, "stats", "seeds")
        assert "lookups 3, first key published before in 0 (0.0%" in stats
        assert "never published 3" in stats


def test_prometheus_counts_missed_lookups_by_reason(daemon):
    with hostkv.Client(daemon.target, "engine") as c:
        _pool(c, "prom", 4)
        _publish(c, "prom", "m", [b"a"])
        c.lookup("prom", "m", [b"b"])
        c.lookup("prom", "other-ns", [b"a"])
    body = urllib.request.urlopen(daemon.metrics_url, timeout=10).read().decode()
    families = prometheus_text.parse(body)
    missed = families["hostkv_cache_missed_lookups_total"]
    assert missed["type"] == "counter"
    reasons = {}
    for _, labels, value in missed["samples"]:
        reasons[labels["reason"]] = reasons.get(labels["reason"], 0) + value
    assert set(reasons) == {"never_published", "evicted", "other_namespace", "refused",
                            "digest_mismatch", "tier_failed"}
    assert reasons["never_published"] >= 1
    assert "hostkv_cache_lookups_total" in families
    assert "hostkv_cache_reusable_lookups_total" in families
