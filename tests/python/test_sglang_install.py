"""hostkv.sglang.install() and the SGLANG_HOSTKV=1 .pth, on a stand-in of
SGLang's module tree (SGLang itself is not a Debian package): the same
module names, and a HiRadixCache-like chooser that picks the host pool class
by isinstance on the device pool and builds it with SGLang's arguments."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.normpath(os.path.join(HERE, "..", "..", "client", "python"))

STANDIN = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/mem_cache/__init__.py": "",
    "sglang/srt/mem_cache/memory_pool.py": """
        class MHATokenToKVPool: pass
        class MLATokenToKVPool: pass
    """,
    "sglang/srt/mem_cache/memory_pool_host.py": """
        class HostKVCache:
            def __init__(self, *args, **kwargs): self.in_process = True
        class MHATokenToKVPoolHost(HostKVCache): pass
        class MLATokenToKVPoolHost(HostKVCache): pass
        class NSATokenToKVPoolHost(MLATokenToKVPoolHost): pass
    """,
    "sglang/srt/mem_cache/hiradix_cache.py": """
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
        from sglang.srt.mem_cache.memory_pool_host import (MHATokenToKVPoolHost,
                                                           MLATokenToKVPoolHost)
        def build_host_pool(kv_cache, ratio, size, page_size, layout):
            if isinstance(kv_cache, MHATokenToKVPool):
                return MHATokenToKVPoolHost(kv_cache, ratio, size, page_size, layout,
                                            allocator_type="default")
            if isinstance(kv_cache, MLATokenToKVPool):
                return MLATokenToKVPoolHost(kv_cache, ratio, size, page_size, layout,
                                            allocator_type="default")
            raise ValueError("no host pool")
    """,
    "sglang/srt/managers/__init__.py": "",
    "sglang/srt/managers/cache_controller.py": """
        from sglang.srt.mem_cache.memory_pool_host import MLATokenToKVPoolHost
    """,
}

# Run in a fresh interpreter: prints which classes SGLang's modules hold.
PROBE = """
import json, sys
{before}
from sglang.srt.mem_cache import hiradix_cache, memory_pool_host
from sglang.srt.managers import cache_controller
print(json.dumps({{
    "installed": "hostkv" in sys.modules,
    "hiradix_mha": hiradix_cache.MHATokenToKVPoolHost.__module__,
    "hiradix_mla": hiradix_cache.MLATokenToKVPoolHost.__module__,
    "host_module": memory_pool_host.MHATokenToKVPoolHost.__module__,
    "controller_mla": cache_controller.MLATokenToKVPoolHost.__module__,
    "nsa_base": memory_pool_host.NSATokenToKVPoolHost.__mro__[1].__module__,
}}))
"""
REMOTE = "hostkv.sglang.host_pool"
ORIGINAL = "sglang.srt.mem_cache.memory_pool_host"


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang-standin")
    for path, text in STANDIN.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(textwrap.dedent(text))
    return str(root)


def probe(python, pythonpath, before="", env_extra=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
    env.pop("SGLANG_HOSTKV", None)
    env.update(env_extra or {})
    out = subprocess.run([python, "-c", PROBE.format(before=before)], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_install_rebinds_only_sglangs_host_pools(standin):
    # Some of SGLang imported before install(), some after.
    before = ("from sglang.srt.mem_cache import hiradix_cache\n"
              "import hostkv.sglang\nprint(hostkv.sglang.install())")
    got = probe(sys.executable, [standin, PACKAGE], before)
    assert got["hiradix_mha"] == REMOTE and got["hiradix_mla"] == REMOTE
    assert got["host_module"] == REMOTE and got["controller_mla"] == REMOTE
    assert got["nsa_base"] == ORIGINAL  # SGLang's own subclasses keep their base


def test_without_install_nothing_changes(standin):
    got = probe(sys.executable, [standin, PACKAGE])
    assert got["hiradix_mha"] == ORIGINAL and not got["installed"]


def test_hiradix_builds_a_working_remote_pool(daemon, standin):
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {HERE!r})
        import hostkv.sglang
        hostkv.sglang.install()
        from sglang.srt.mem_cache import hiradix_cache, memory_pool
        from sglang_model import DevicePool
        class Device(DevicePool, memory_pool.MHATokenToKVPool):
            pass
        device = Device("mha", 2, size=32, page_size=16)
        host = hiradix_cache.build_host_pool(device, 2.0, 0, 16, "layer_first")
        device.fill_random(torch.Generator().manual_seed(1))
        idx = host.alloc(16)
        host.backup_from_device_all_layer(device, idx, torch.arange(16), "kernel")
        ok = torch.equal(host.k_buffer[1, idx], device.k_buffer[1][:16])
        print(type(host).__name__, ok)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([standin, PACKAGE]),
               HOSTKV_TARGET=daemon.target)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["RemoteMHATokenToKVPoolHost", "True"]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A venv over Debian's packages with `pip install ./client/python` in it."""
    path = tmp_path_factory.mktemp("venv")
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(path)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"python3 -m venv does not work here (python3-venv): {made.stderr}")
    pip = subprocess.run([str(path / "bin" / "pip"), "install", "-q", "--no-deps",
                          "--no-build-isolation", PACKAGE], capture_output=True, text=True,
                         timeout=300)
    assert pip.returncode == 0, pip.stderr
    return str(path / "bin" / "python")


def test_pip_installed_pth_is_opt_in(venv, standin):
    assert probe(venv, [standin])["hiradix_mha"] == ORIGINAL
    assert not probe(venv, [standin])["installed"]  # the .pth imports nothing then
    got = probe(venv, [standin], env_extra={"SGLANG_HOSTKV": "1"})
    assert got["hiradix_mha"] == REMOTE and got["controller_mla"] == REMOTE
    assert got["nsa_base"] == ORIGINAL
    # The installed package carries its generated stubs.
    out = subprocess.run([venv, "-c", "import hostkv; print(hostkv.pb.PoolSpec.DESCRIPTOR.name)"],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=""),
                         cwd="/", check=True)
    assert out.stdout.strip() == "PoolSpec"


def test_pip_installed_package_carries_the_vllm_spec(venv):
    # vLLM imports the spec by module path: hostkv.vllm must be installed,
    # and (with the stand-in of vLLM's API on the path) load.
    standin = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_standin")
    out = subprocess.run(
        [venv, "-c", "import hostkv.vllm as v; print(v.HostkvOffloadingSpec.__module__)"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=standin), cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "hostkv.vllm.spec"
    # Without any vLLM it says which versions it needs.
    out = subprocess.run([venv, "-c", "import hostkv.vllm"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=""), cwd="/")
    assert out.returncode != 0 and "v0.11-v0.20" in out.stderr


def test_pip_installed_package_registers_its_sglang_plugin(venv):
    # SGLang's load_plugins() finds hostkv by its entry point group.
    out = subprocess.run(
        [venv, "-c", "import importlib.metadata as m; print([(e.name, e.value) for e in "
         "m.entry_points(group='sglang.srt.plugins')])"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=""), cwd="/")
    assert out.returncode == 0, out.stderr
    assert "('hostkv', 'hostkv.sglang.plugin:register')" in out.stdout
