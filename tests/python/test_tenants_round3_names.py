"""Names engines derive cannot be taken first by another user (issue 38,
V1a/V1b): hostkv's adapters put "uid<N>." in front of the pools and
namespaces they derive from the model and layout, and hostkvd lets only
uid N create such a pool or first publish in such a namespace. Each attack
runs as another user (nobody) against a real daemon that lets every uid
use every pool (--pool_access=any), where squatting did the most harm.
Needs root."""
import json
import os
import subprocess
import sys

import pytest

import hostkv

from conftest import Daemon
from test_cache_access import NOBODY, nobody_env  # noqa: F401,F811  (a fixture)

PAGE = 4

# Runs as nobody: tries to take each name first.
SQUAT = """
import json, sys
import hostkv
from hostkv import cache_calls, errors
target, pools, namespaces = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
out = {}
with hostkv.Client(target, "squatter") as c:
    c.create_pool(hostkv.mha_pool_spec("uid%d.squatter-own", num_layers=1, num_kv_heads=1,
                                       head_dim=8, page_size=%d, capacity_tokens=64))
    for name in pools:
        try:
            c.create_pool(hostkv.mha_pool_spec(name, num_layers=1, num_kv_heads=1, head_dim=8,
                                               page_size=%d, capacity_tokens=64))
            out[name] = "created"
        except errors.HostKVError as e:
            out[name] = e.code_name
    page = cache_calls.page_list(c.alloc("uid%d.squatter-own", %d))
    for ns in namespaces:
        try:
            c.publish("uid%d.squatter-own", ns, [b"poison"], [(page[0], 1)])
            out[ns] = "published"
        except errors.HostKVError as e:
            out[ns] = e.code_name
print(json.dumps(out))
""" % (NOBODY, PAGE, PAGE, NOBODY, PAGE, NOBODY)


@pytest.fixture(scope="module")
def daemon():
    if os.getuid() != 0:
        pytest.skip("needs root to run a client as another user")
    d = Daemon("--pool_access=any", "--cache_share=any", "--socket_mode=0666")
    os.chmod(d.workdir, 0o755)  # let the other user reach the socket
    yield d
    d.stop()


def _squat(daemon, env, pools, namespaces):
    def as_nobody():
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    out = subprocess.run([sys.executable, "-c", SQUAT, daemon.target, json.dumps(pools),
                          json.dumps(namespaces)], capture_output=True, text=True, env=env,
                         timeout=60, preexec_fn=as_nobody, cwd="/")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_another_user_cannot_take_an_engines_derived_names_first(daemon, nobody_env):
    import importlib.util
    import types
    from hostkv._owned_names import owner_prefix
    # hostkv.vllm's placement without vLLM (the package needs vLLM installed).
    spec = importlib.util.spec_from_file_location(
        "hostkv_vllm_placement",
        os.path.join(os.path.dirname(hostkv.__file__), "vllm", "placement.py"))
    placement = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(placement)
    GroupPlacement = placement.GroupPlacement  # pylint: disable=invalid-name
    config = types.SimpleNamespace(
        groups=[types.SimpleNamespace(group_id=0, tokens_per_block=16, layer_names=["l0"])],
        parallel=types.SimpleNamespace(world_size=1, tp_size=1, pp_size=1),
        model=types.SimpleNamespace(name="org/llama", dtype="bfloat16"),
        cache=types.SimpleNamespace(tokens_per_hash=16, blocks_per_chunk=1))
    mine = GroupPlacement(config, owner=owner_prefix(daemon.target))
    shared = GroupPlacement(config, owner=owner_prefix(daemon.target, shared=True))
    pool, namespace = mine.places(0)[0]
    assert pool.startswith("uid0.") and namespace.startswith("uid0.")
    old_pool, old_namespace = shared.places(0)[0]  # the names before the prefix
    result = _squat(daemon, nobody_env, [pool, old_pool], [namespace, old_namespace])
    # The reserved names are refused to nobody; the unreserved ones (how
    # every engine named its pages before) could be taken first.
    assert result == {pool: "PERMISSION_DENIED", old_pool: "created",
                      namespace: "PERMISSION_DENIED", old_namespace: "published"}
    # The engine's own names are still free for it, and its pool is its own.
    with hostkv.Client(daemon.target, "engine") as c:
        c.create_pool(hostkv.mha_pool_spec(pool, num_layers=1, num_kv_heads=1, head_dim=8,
                                           page_size=PAGE, capacity_tokens=64))
        assert c.get_pool(pool).owner.uid == 0
        pages = c.alloc(pool, PAGE)
        assert c.publish(pool, namespace, [b"k"], pages).cached == 1
        assert c.lookup(pool, namespace, [b"k"]).hits == 1


def test_root_cannot_take_another_users_reserved_names_either(daemon):
    with hostkv.Client(daemon.target, "root") as c:
        with pytest.raises(hostkv.errors.PermissionDenied, match="reserved to uid 4242"):
            c.create_pool(hostkv.mha_pool_spec("uid4242.p", num_layers=1, num_kv_heads=1,
                                               head_dim=8, page_size=PAGE, capacity_tokens=64))
        c.create_pool(hostkv.mha_pool_spec("uid0.p", num_layers=1, num_kv_heads=1,
                                           head_dim=8, page_size=PAGE, capacity_tokens=64))
        pages = c.alloc("uid0.p", PAGE)
        with pytest.raises(hostkv.errors.PermissionDenied, match="reserved to uid 4242"):
            c.publish("uid0.p", "uid4242.ns", [b"k"], pages)
        c.free("uid0.p", pages)


def test_the_sglang_linker_names_its_pools_for_its_user(daemon):
    import sglang_linker_driver as drv
    with drv.standin():
        e = drv.Engine(daemon.target, tp=1, extra={"hostkv_namespace": "owned"})
        linker = e.ranks[0].linker
        assert linker.pools["kv"].startswith(f"uid{os.getuid()}.")
        assert linker._parts["kv"].place.namespace.startswith(  # pylint: disable=W0212
            f"uid{os.getuid()}.")
        e.close()
