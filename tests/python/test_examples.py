"""The examples README shows run as shown and verify their bytes."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from conftest import hostkvd_binary  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client",
                        "python", "examples")


def test_sglang_cpu_demo(daemon):
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, "sglang_cpu_demo.py"),
                          daemon.target], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "OK"
    assert sum("bytes match" in line for line in lines) == 5  # 4 layers + the page view
    assert not any("MISMATCH" in line for line in lines)


def test_warm_restart_demo(daemon):
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, "warm_restart_demo.py"),
                          daemon.target], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "OK"
    assert "published 8 pages" in lines[0]
    assert "killed with SIGKILL (exit -9)" in lines[1]
    assert "8 of 8 pages found" in lines[2]
    assert sum("bytes match" in line for line in lines) == 4  # every layer
    assert not any("MISMATCH" in line for line in lines)


def test_warm_restart_demo_finds_the_daemon_in_hostkv_target(daemon):
    """Without an argument the demo takes $HOSTKV_TARGET, as README's command
    (with the quickstart's daemon) runs it."""
    env = dict(os.environ, HOSTKV_TARGET=daemon.target)
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, "warm_restart_demo.py")],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "OK"


def test_two_node_demo():
    """Its own redis-server and two daemons (the binary under test)."""
    import shutil
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, "two_node_demo.py"),
                          "--hostkvd", hostkvd_binary()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "engine published 8 pages" in out.stdout
    assert "tier wrote 8 pages" in out.stdout
    assert "host memory held 0 of these pages; lookup found 8 of 8 keys" in out.stdout
    assert lines[-1] == "node B: 8 of 8 pages match node A's bytes: bytes match"
