"""Many users on one node, round 3 (issue 38): cache-namespace claims are given
back when nobody uses them (--namespace_release_after), against a real
hostkvd, the other user a child process as nobody.

A claim stays while a page is cached in the namespace or its owner has a
session open; once neither holds for one to two periods, its owner's
--max_cache_namespaces_per_uid share and its daemon-ledger slot are free, and
the name goes to whoever publishes in it next. Before, claims were kept for
ever: a uid that had used its 256 namespaces could claim no new one until
the daemon was restarted without its state, and the ledger's 65,536 slots
were never freed.
"""
import json
import os
import subprocess
import sys
import time

import pytest

import hostkv
from hostkv import errors

from conftest import Daemon
from test_cache_access import NOBODY, nobody_env  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run a client as another user")

PAGE = 4

# Runs as nobody: publishes one page in namespace argv[2] of its own pool.
PUBLISH = """
import json, sys
import hostkv
from hostkv import errors
target, name_space = sys.argv[1:3]
with hostkv.Client(target, "other-user") as c:
    c.create_pool(hostkv.mha_pool_spec("nobody-pool", num_layers=1, num_kv_heads=1,
                                       head_dim=8, page_size=%d, capacity_tokens=64))
    try:
        c.publish("nobody-pool", name_space, [b"nobody-key"], c.alloc("nobody-pool", %d))
        print(json.dumps("ok"))
    except errors.HostKVError as e:
        print(json.dumps(e.code_name))
""" % (PAGE, PAGE)


def as_nobody():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def nobody_publishes(daemon, env, name_space):
    out = subprocess.run([sys.executable, "-c", PUBLISH, daemon.target, name_space],
                         capture_output=True, text=True, env=env, timeout=60,
                         preexec_fn=as_nobody, cwd="/")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def spec(name):
    return hostkv.mha_pool_spec(name, num_layers=1, num_kv_heads=1, head_dim=8,
                                page_size=PAGE, capacity_tokens=64)


def publish(client, pool, name_space):
    client.publish(pool, name_space, [b"root-key"], client.alloc(pool, PAGE))


def test_a_namespace_nobody_uses_is_given_back(nobody_env):
    daemon = Daemon("--pool_access=any", "--socket_mode=0666",
                    "--namespace_release_after=1s", "--max_cache_namespaces_per_uid=2")
    os.chmod(daemon.workdir, 0o755)  # the other user reaches the socket
    try:
        with hostkv.Client(daemon.target, "root-engine") as c:
            c.create_pool(spec("root-pool"), delete_with_session=True)
            publish(c, "root-pool", "ns-a")
            publish(c, "root-pool", "ns-b")
            with pytest.raises(errors.ResourceExhausted, match="max_cache_namespaces_per_uid"):
                publish(c, "root-pool", "ns-c")
            assert nobody_publishes(daemon, nobody_env, "ns-a") == "PERMISSION_DENIED"
            # Unused for several periods, but its owner's session is open.
            time.sleep(3)
            assert nobody_publishes(daemon, nobody_env, "ns-a") == "PERMISSION_DENIED"
        # The session ended, its pool (and pages) with it: given back within
        # two periods.
        deadline = time.monotonic() + 15
        while nobody_publishes(daemon, nobody_env, "ns-a") != "ok":
            assert time.monotonic() < deadline, "root's claim on ns-a was never given back"
            time.sleep(0.5)
        with hostkv.Client(daemon.target, "root-engine") as c:
            c.create_pool(spec("root-pool-2"))
            # Root's share is whole again: ns-a went to nobody, ns-b back.
            publish(c, "root-pool-2", "ns-c")
            publish(c, "root-pool-2", "ns-d")
            with pytest.raises(errors.PermissionDenied):
                publish(c, "root-pool-2", "ns-a")
        # The daemon ledger was rewritten slot by slot: a restarted daemon
        # adopts nobody's claim on ns-a and root's two, nothing else.
        daemon.kill()
        daemon.restart()
        with hostkv.Client(daemon.target, "root-engine") as c:
            with pytest.raises(errors.PermissionDenied):
                publish(c, "root-pool-2", "ns-a")
            with pytest.raises(errors.ResourceExhausted):
                publish(c, "root-pool-2", "ns-e")
            assert c.lookup("root-pool-2", "ns-c", [b"root-key"]).hits == 1
    finally:
        daemon.stop()
