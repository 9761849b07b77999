"""Lets every Python benchmark run as tests/bench/README.md writes it, on a
machine set up by README's first command, whichever `python3` comes first on
PATH. Imported first by each benchmark:

- under an interpreter without the packages the benchmarks need (grpcio,
  protobuf, torch: Debian's python3-* packages), the benchmark runs again
  under Debian's /usr/bin/python3;
- the repository's client/python is importable (and on PYTHONPATH for the
  processes a benchmark starts);
- HOSTKV_PROTO_DIR, HOSTKVD and HOSTKV_CLI default to what build/ holds
  (HOSTKV_BUILD_DIR names another build directory).
"""
import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SYSTEM_PYTHON = "/usr/bin/python3"
NEEDED = ("grpc", "google.protobuf", "torch")


def _missing():
    missing = []
    for name in NEEDED:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    return missing


_missing_now = _missing()
if _missing_now:
    if os.environ.get("HOSTKV_BENCH_REEXEC") or not os.path.exists(SYSTEM_PYTHON):
        sys.exit(f"{sys.argv[0]}: this interpreter ({sys.executable}) lacks "
                 f"{', '.join(_missing_now)}: run it with Debian's {SYSTEM_PYTHON} "
                 "(apt-get install python3-grpcio python3-protobuf python3-torch)")
    os.environ["HOSTKV_BENCH_REEXEC"] = "1"
    os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, os.path.abspath(sys.argv[0])] + sys.argv[1:])

_client = os.path.join(REPO, "client", "python")
if _client not in sys.path:
    sys.path.insert(0, _client)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_client, os.environ.get("PYTHONPATH")) if p)

_build = os.environ.get("HOSTKV_BUILD_DIR", os.path.join(REPO, "build"))
for _var, _path in (("HOSTKV_PROTO_DIR", os.path.join(_build, "client", "python", "hostkv_proto")),
                    ("HOSTKVD", os.path.join(_build, "server", "hostkvd")),
                    ("HOSTKV_CLI", os.path.join(_build, "client", "hostkv"))):
    if not os.environ.get(_var) and os.path.exists(_path):
        os.environ[_var] = _path
