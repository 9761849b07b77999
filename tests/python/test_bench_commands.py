"""tests/bench/README.md's Python benchmark commands run as written on a
machine set up by README's first command, whichever python3 comes first on
PATH (bench_env.py): here an interpreter that finds none of Debian's
packages (python3 -S) and an environment without PYTHONPATH or
HOSTKV_PROTO_DIR, from outside the checkout. Each benchmark gets as far as
its --help, past every import."""
import glob
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench")
SCRIPTS = sorted(p for p in glob.glob(os.path.join(BENCH, "*.py"))
                 if os.path.basename(p) != "bench_env.py")


def test_every_python_benchmark_is_covered():
    assert len(SCRIPTS) >= 7, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_a_benchmark_runs_as_written_without_the_environment(script, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "HOSTKV_PROTO_DIR", "HOSTKV_BENCH_REEXEC")}
    out = subprocess.run([sys.executable, "-S", script, "--help"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "usage:" in out.stdout
