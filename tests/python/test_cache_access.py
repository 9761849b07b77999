"""Who may use a cache namespace, through hostkv.Client: its first
publisher's uid (and root); another user gets PermissionDenied, in a pool
both may use. Needs root (the other user is a child process as nobody)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

import hostkv

from conftest import Daemon

NOBODY = 65534
PAGE = 4

# Runs as nobody: what it may do in root's namespace and in its own.
PROBE = """
import json, sys
import hostkv
from hostkv import cache_calls, errors
target, pool, theirs, mine = sys.argv[1:5]
out = {}
with hostkv.Client(target, "other-user") as c:
    pages = cache_calls.page_list(c.alloc(pool, 2 * %d))
    for name, call in (("lookup_theirs", lambda: c.lookup(pool, theirs, [b"root-key"])),
                       ("publish_theirs", lambda: c.publish(pool, theirs, [b"forged"],
                                                            [(pages[0], 1)]))):
        try:
            call()
            out[name] = "ok"
        except errors.HostKVError as e:
            out[name] = e.code_name
    done = c.publish(pool, mine, [b"nobody-key"], [(pages[1], 1)])
    out["publish_mine"] = done.cached
    out["lookup_mine"] = c.lookup(pool, mine, [b"nobody-key"]).hits
print(json.dumps(out))
""" % PAGE


@pytest.fixture(scope="module")
def nobody_env():
    """The environment for the other user's client: the hostkv package and
    its stubs copied where nobody may read them (the checkout and the build
    tree may sit under a private directory, e.g. one mktemp -d made)."""
    root = tempfile.mkdtemp(prefix="hostkv-pytest-nobody-")
    shutil.copytree(os.path.dirname(hostkv.__file__), os.path.join(root, "hostkv"))
    env = dict(os.environ, PYTHONPATH=root)
    if os.environ.get("HOSTKV_PROTO_DIR"):
        env["HOSTKV_PROTO_DIR"] = os.path.join(root, "proto")
        shutil.copytree(os.environ["HOSTKV_PROTO_DIR"], env["HOSTKV_PROTO_DIR"])
    for base, dirs, files in os.walk(root):
        os.chmod(base, 0o755)
        for name in files:
            os.chmod(os.path.join(base, name), 0o644)
    yield env
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon():
    if os.getuid() != 0:
        pytest.skip("needs root to run a client as another user")
    d = Daemon("--pool_access=any", "--socket_mode=0666")
    os.chmod(d.workdir, 0o755)  # let the other user reach the socket
    yield d
    d.stop()


def test_a_namespace_belongs_to_its_first_publishers_uid(daemon, nobody_env):
    with hostkv.Client(daemon.target, "root-engine") as c:
        c.create_pool(hostkv.mha_pool_spec("shared-cache", num_layers=1, num_kv_heads=1,
                                           head_dim=8, page_size=PAGE, capacity_tokens=64))
        c.publish("shared-cache", "root/ns", [b"root-key"], c.alloc("shared-cache", PAGE))
        def as_nobody():
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)

        out = subprocess.run(
            [sys.executable, "-c", PROBE, daemon.target, "shared-cache", "root/ns",
             "nobody/ns"], capture_output=True, text=True, env=nobody_env, timeout=60,
            preexec_fn=as_nobody, cwd="/")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout.splitlines()[-1])
        assert result == {"lookup_theirs": "PERMISSION_DENIED",
                          "publish_theirs": "PERMISSION_DENIED",
                          "publish_mine": 1, "lookup_mine": 1}
        # Root is no exception (another user's namespace would serve root
        # that user's bytes); the forged key is not in root's.
        with pytest.raises(hostkv.errors.PermissionDenied):
            c.lookup("shared-cache", "nobody/ns", [b"nobody-key"])
        assert c.lookup("shared-cache", "root/ns", [b"forged"]).hits == 0
