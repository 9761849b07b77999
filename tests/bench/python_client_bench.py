#!/usr/bin/python3
"""What the Python client costs beside the C++ client and a bare gRPC call.

One hostkvd (CPU backend, on a private unix socket), one pool (MHA, 2
layers, 2 KV heads x 64, bf16, page_size 16), and two clients of it in one
run: client_cost_bench (hostkv::Client, C++) and hostkv.Client (this
process). Each times, on one thread, the same operations:

  health_check     grpc.health.v1.Health/Check with no client library and no
                   deadline: the language's bare unary gRPC call (baseline)
  alloc_bare_stub  hostkv.v1.HostKV/Alloc of 1 page through the generated
                   stub alone (the page is freed untimed)
  alloc, free      Client alloc of 16 tokens (1 page), then free of it
  load_submit      Client load of that 1 page (one run) into a registered
                   sealed-memfd device buffer, until the call returns
  load_wait        the same, until wait() returns (both layers copied)
  backup_submit    Client backup of the same page(s), until the call returns

With --pages=N every operation but the bare call moves N pages (one run
each side). Both clients send the hot calls through the session's command
ring (proto/contract/command_ring.h) unless --command_ring=off.
--matrix runs 1, 16 and 256 pages with the ring on and off, one daemon
each, and prints one table of p50s beside the bare call.

Each round runs `per_round` calls of each operation in C++, then in
Python (Python first in odd rounds). Prints a Markdown table: p50/p99
latencies over all samples, one-caller ops/s (1 / mean latency), and the
ratios Python / C++ and op / bare call, each the median over rounds of that
round's ratio of p50s (a round's blocks are adjacent in time, so the ratio
cancels most of a shared machine's drift) with the interquartile range of
those ratios. Asserts no timing: it exits non-zero only if something failed
or a row is missing.

  tests/bench/run.sh --python_client           # builds, then runs this
  python3 tests/bench/python_client_bench.py [--build_dir=build-bench]
      [--quick] [--rounds=N] [--per_round=N] [--json=FILE]
      [--pages=N] [--command_ring=on|off] [--matrix]
"""
import bench_env  # noqa: F401,E402 (first: Debian's python3, client/python, build/ defaults)
import argparse
import datetime
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PAGE_SIZE = 16
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 64
POOL = "client-cost"
BARE = "health_check"
# (key, what the row shows), in the order each round runs them.
OPS = [
    ("health_check", "bare unary gRPC call (Health/Check)"),
    ("alloc_bare_stub", "Alloc, generated stub only"),
    ("alloc", "Client alloc"),
    ("free", "Client free"),
    ("load_submit", "Client load submit (enqueued)"),
    ("load_wait", "Client load + wait (2 layers copied)"),
    ("backup_submit", "Client backup submit (enqueued)"),
]
# What the Python client passes to grpc.insecure_channel (client.py).
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 << 20),
                   ("grpc.max_send_message_length", 256 << 20),
                   ("grpc.enable_http_proxy", 0)]


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


def percentile(values, p):
    """Nearest rank, as Samples::Percentile (tests/bench/bench_util.cc)."""
    s = sorted(values)
    rank = min(max(math.ceil(p / 100.0 * len(s)), 1), len(s))
    return s[rank - 1]


class Daemon:
    """hostkvd on unix:<tmp>/hostkvd.sock with the benchmarks' flags."""

    def __init__(self, binary, hostkv):
        self.workdir = tempfile.mkdtemp(prefix="hostkv-client-cost-")
        self.sock = os.path.join(self.workdir, "hostkvd.sock")
        self.target = f"unix:{self.sock}"
        self.flags = ["--memory_reserve=256MiB", "--log_level=info"]
        self.log_path = os.path.join(self.workdir, "hostkvd.log")
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                [binary, f"--listen={self.target}", *self.flags], stderr=log_file,
                stdout=log_file)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.fail("hostkvd exited at start")
            if os.path.exists(self.sock + ".session"):
                try:
                    hostkv.Client(self.target, "probe", connect_timeout=1).close()
                    return
                except hostkv.errors.Unavailable:
                    pass
            time.sleep(0.05)
        self.fail("hostkvd did not come up")

    def fail(self, what):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            sys.exit(f"{what}; its log:\n{f.read()}")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


class PythonCost:
    """The Python half: one hostkv.Client session, a bare channel beside it,
    a registered device buffer and one page to load from. Single-threaded."""

    def __init__(self, hostkv, grpc, target, pages=1, ring=True):
        pb = hostkv.pb
        from hostkv._proto import hostkv_pb2_grpc  # pylint: disable=import-outside-toplevel
        self.client = hostkv.Client(target, "client-cost-bench-py", command_ring=ring)
        self.pool = POOL
        self.tokens = pages * PAGE_SIZE
        info = self.client.create_pool(hostkv.mha_pool_spec(
            POOL, num_layers=LAYERS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
            page_size=PAGE_SIZE, dtype="bf16", layout="page_first",
            capacity_tokens=1024 * PAGE_SIZE))
        # A second channel with the client's options shares its connection
        # (gRPC's global subchannel pool), like the C++ HealthCaller's.
        self.channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        # bytes in, bytes out: an empty HealthCheckRequest is b"".
        self.health = self.channel.unary_unary("/grpc.health.v1.Health/Check")
        if self.health(b"") != b"\x08\x01":
            sys.exit("the bare health check did not answer SERVING")
        self.stub = hostkv_pb2_grpc.HostKVStub(self.channel)
        self.alloc_request = pb.AllocRequest(session_id=self.client.session_id,
                                             pool=POOL, num_tokens=self.tokens)
        # The device side: one sealed memfd with K then V of every layer,
        # max(4, pages) pages of slots each, passed over the session socket.
        slots = max(4, pages) * PAGE_SIZE
        nbytes = slots * info.token_stride
        self.device = hostkv.shm.SealedBuffer(nbytes * LAYERS * 2)
        handle = self.client.pass_descriptor(self.device.fd)
        k = [hostkv.shm.describe_passed(handle, l * nbytes, nbytes) for l in range(LAYERS)]
        v = [hostkv.shm.describe_passed(handle, (LAYERS + l) * nbytes, nbytes)
             for l in range(LAYERS)]
        self.import_id = self.client.register_device_buffers(POOL, slots, k, v)
        self.load_pages = self.client.alloc(POOL, self.tokens)
        self.samples = {key: [] for key, _ in OPS}
        self.round_p50 = {key: [] for key, _ in OPS}

    def alloc_bare_stub(self):
        response = self.stub.Alloc(self.alloc_request)
        return [(r.first_page, r.num_pages) for r in response.pages]

    def warmup(self, n):
        for _ in range(n):
            self.health(b"")
            self.client.free(POOL, self.alloc_bare_stub())
            self.client.free(POOL, self.client.alloc(POOL, self.tokens))
            self.client.wait(self.client.load(POOL, self.import_id, self.load_pages,
                                              [(0, self.tokens)]))
            self.client.wait(self.client.backup(POOL, self.import_id, self.load_pages,
                                                [(0, self.tokens)]))

    def round(self, per_round):
        """per_round timed calls of each operation, in the order of OPS."""
        now = time.perf_counter_ns
        client, pool, health = self.client, self.pool, self.health
        got = {key: [] for key, _ in OPS}
        for _ in range(per_round):
            t0 = now()
            health(b"")
            got["health_check"].append(now() - t0)
        for _ in range(per_round):
            t0 = now()
            pages = self.alloc_bare_stub()
            got["alloc_bare_stub"].append(now() - t0)
            client.free(pool, pages)
        for _ in range(per_round):
            t0 = now()
            pages = client.alloc(pool, self.tokens)
            t1 = now()
            client.free(pool, pages)
            t2 = now()
            got["alloc"].append(t1 - t0)
            got["free"].append(t2 - t1)
        device_slots = [(0, self.tokens)]
        for _ in range(per_round):
            t0 = now()
            op = client.load(pool, self.import_id, self.load_pages, device_slots)
            t1 = now()
            client.wait(op)
            t2 = now()
            got["load_submit"].append(t1 - t0)
            got["load_wait"].append(t2 - t0)
        for _ in range(per_round):
            t0 = now()
            op = client.backup(pool, self.import_id, self.load_pages, device_slots)
            got["backup_submit"].append(now() - t0)
            client.wait(op)
        for key, values in got.items():
            self.samples[key].extend(values)
            self.round_p50[key].append(percentile(values, 50) / 1e3)

    def results(self):
        ops = {}
        for key, values in self.samples.items():
            if not values:
                continue
            mean_ns = sum(values) / len(values)
            ops[key] = {"n": len(values), "p50_us": percentile(values, 50) / 1e3,
                        "p99_us": percentile(values, 99) / 1e3,
                        "ops_per_s": 1e9 / mean_ns if mean_ns else 0,
                        "round_p50_us": self.round_p50[key]}
        return {"language": "Python", "page_size": PAGE_SIZE,
                "pages": self.tokens // PAGE_SIZE,
                "command_ring": self.client.uses_command_ring, "ops": ops}

    def close(self):
        self.channel.close()
        self.client.close()  # frees the pages, unregisters the buffer
        self.device.close()


class CppCost:
    """client_cost_bench as a child, one round per line it is sent."""

    def __init__(self, binary, target, per_round, warmup, pages=1, ring=True):
        env = dict(os.environ, HOSTKV_COMMAND_RING="1" if ring else "0")
        self.process = subprocess.Popen(
            [binary, f"--target={target}", f"--pool={POOL}", f"--per_round={per_round}",
             f"--warmup={warmup}", f"--pages={pages}", "--stdin_rounds"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._expect("ready")

    def _expect(self, word):
        line = self.process.stdout.readline()
        if line.strip() != word:
            self.process.kill()
            sys.exit(f"client_cost_bench said {line!r}, not {word!r}")

    def round(self):
        self.process.stdin.write("round\n")
        self.process.stdin.flush()
        self._expect("done")

    def results(self):
        self.process.stdin.close()
        out = self.process.stdout.read()
        if self.process.wait() != 0:
            sys.exit(f"client_cost_bench exited with {self.process.returncode}")
        return json.loads(out.strip().splitlines()[-1])


def fmt(v):
    """As Num() in bench_util.cc: 3 significant digits or so."""
    a = abs(v)
    if v == 0:
        return "0"
    if a >= 1e6 or a < 1e-3:
        return f"{v:.3g}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}" if a >= 1 else f"{v:.3f}"


def ratios(ops_a, key_a, ops_b, key_b):
    """Per round: round p50 of a / round p50 of b (the same round's blocks,
    adjacent in time, so both saw the same machine)."""
    return [a / b for a, b in zip(ops_a[key_a]["round_p50_us"], ops_b[key_b]["round_p50_us"])]


def ratio_cell(values):
    """Median of per-round ratios, and their interquartile range."""
    return (f"{fmt(percentile(values, 50))} "
            f"({fmt(percentile(values, 25))}-{fmt(percentile(values, 75))})")


def table(cpp, py):
    """The Markdown table: latencies over all samples; ratios as medians of
    per-round ratios, with their interquartile range."""
    c, p = cpp["ops"], py["ops"]
    lines = [
        "| operation | C++ p50 us | C++ p99 us | C++ ops/s | Python p50 us | Python p99 us "
        "| Python ops/s | Python / C++ | C++ / bare call | Python / bare call |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for key, label in OPS:
        over_bare = ["(baseline)"] * 2 if key == BARE else [
            ratio_cell(ratios(c, key, c, BARE)), ratio_cell(ratios(p, key, p, BARE))]
        cells = [label]
        for lang in (c, p):
            cells += [fmt(lang[key]["p50_us"]), fmt(lang[key]["p99_us"]),
                      fmt(lang[key]["ops_per_s"])]
        cells += [ratio_cell(ratios(p, key, c, key)), *over_bare]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_rev():
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "diff", "--quiet", "HEAD"]).returncode
        return rev + (" (uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build_dir", default=os.path.join(REPO, "build-bench"),
                        help="where hostkvd, client_cost_bench and the stubs were built")
    parser.add_argument("--hostkvd", help="default BUILD_DIR/server/hostkvd")
    parser.add_argument("--cpp_bench", help="default BUILD_DIR/tests/bench/client_cost_bench")
    parser.add_argument("--proto_dir", help="default BUILD_DIR/client/python/hostkv_proto")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run of a few seconds (4 rounds of 20)")
    parser.add_argument("--rounds", type=int, help="default 100 (quick: 4)")
    parser.add_argument("--per_round", type=int, help="default 100 (quick: 20)")
    parser.add_argument("--warmup", type=int, help="default 200 (quick: 10)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--pages", type=int, default=1,
                        help="pages per alloc, free, load and backup (default 1)")
    parser.add_argument("--command_ring", choices=("on", "off"), default="on",
                        help="hot calls through the command ring (default) or gRPC")
    parser.add_argument("--matrix", action="store_true",
                        help="1, 16 and 256 pages, ring on and off: one summary table")
    args = parser.parse_args()
    defaults = (4, 20, 10) if args.quick else (100, 100, 200)
    for name, value in zip(("rounds", "per_round", "warmup"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.hostkvd = args.hostkvd or os.path.join(args.build_dir, "server", "hostkvd")
    args.cpp_bench = args.cpp_bench or os.path.join(args.build_dir, "tests", "bench",
                                                    "client_cost_bench")
    args.proto_dir = args.proto_dir or os.path.join(args.build_dir, "client", "python",
                                                    "hostkv_proto")
    for path in (args.hostkvd, args.cpp_bench):
        if not os.access(path, os.X_OK):
            parser.error(f"{path} is not built (cmake --build BUILD_DIR --target hostkvd "
                         "client_cost_bench hostkv_python_stubs)")
    if not os.path.exists(os.path.join(args.proto_dir, "hostkv_pb2.py")):
        parser.error(f"no generated stubs in {args.proto_dir}")
    return args


def run(args, hostkv, grpc, pages=None, ring=None):
    pages = args.pages if pages is None else pages
    ring = (args.command_ring == "on") if ring is None else ring
    daemon = Daemon(args.hostkvd, hostkv)
    py = cpp = None
    try:
        py = PythonCost(hostkv, grpc, daemon.target, pages, ring)
        cpp = CppCost(args.cpp_bench, daemon.target, args.per_round, args.warmup, pages, ring)
        py.warmup(args.warmup)
        start = time.monotonic()
        for r in range(args.rounds):
            halves = [cpp.round, lambda: py.round(args.per_round)]
            for half in halves if r % 2 == 0 else reversed(halves):
                half()
            log(f"round {r + 1}/{args.rounds} done")
        seconds = time.monotonic() - start
        return cpp.results(), py.results(), seconds, daemon.flags
    finally:
        if cpp is not None and cpp.process.poll() is None:
            cpp.process.kill()
        if py is not None:
            py.close()
        daemon.stop()


MATRIX_OPS = ["alloc", "free", "load_submit", "backup_submit"]


def matrix(args, hostkv, grpc, load_before):
    """p50 of the hot calls at 1, 16 and 256 pages, through the ring and
    through gRPC, beside the bare call of the same run."""
    rows = []
    for pages in (1, 16, 256):
        runs = {}
        for ring in (True, False):
            cpp, py, _, _ = run(args, hostkv, grpc, pages, ring)
            for lang in (cpp, py):
                if lang["command_ring"] != ring:
                    sys.exit(f"{lang['language']}: command ring {lang['command_ring']}, "
                             f"wanted {ring}")
            runs[ring] = (cpp["ops"], py["ops"])
            log(f"{pages} pages, ring {'on' if ring else 'off'} done")
        for key in MATRIX_OPS:
            cells = [key, str(pages)]
            for lang in (0, 1):
                on, off = runs[True][lang], runs[False][lang]
                cells += [fmt(on[key]["p50_us"]), fmt(off[key]["p50_us"]),
                          fmt(on[BARE]["p50_us"]),
                          ratio_cell(ratios(on, key, off, key))]
            rows.append("| " + " | ".join(cells) + " |")
    print(f"- {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, git {git_rev()}, "
          f"{cpu_model()}, {os.cpu_count()} hardware threads, load {load_before:.2f} / "
          f"{os.getloadavg()[0]:.2f}; {args.rounds} rounds x {args.per_round} calls, "
          f"page_size {PAGE_SIZE}")
    print()
    print("| call | pages | C++ ring p50 us | C++ gRPC p50 us | C++ bare call us | "
          "C++ ring / gRPC | Python ring p50 us | Python gRPC p50 us | Python bare call us "
          "| Python ring / gRPC |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    print("\n".join(rows))


def main():
    args = parse_args()
    os.environ["HOSTKV_PROTO_DIR"] = args.proto_dir
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    # pylint: disable=import-outside-toplevel
    import grpc
    from google.protobuf.internal import api_implementation
    import hostkv
    import hostkv.shm  # noqa: F401

    load_before = os.getloadavg()[0]
    if args.matrix:
        matrix(args, hostkv, grpc, load_before)
        return
    cpp, py, seconds, flags = run(args, hostkv, grpc)
    missing = [f"{lang['language']} {key}" for lang in (cpp, py) for key, _ in OPS
               if lang["ops"].get(key, {}).get("n") != args.rounds * args.per_round]
    if missing:
        sys.exit(f"rows missing or short: {', '.join(missing)}")
    meta = {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z"),
        "git": git_rev(),
        "cpu": f"{cpu_model()}, {os.cpu_count()} hardware threads",
        "C++ build": cpp["build"],
        "Python": f"{platform.python_version()}, grpcio {grpc.__version__}, protobuf "
                  f"{api_implementation.Type()} backend",
        "daemon flags": " ".join(flags),
        "load average (1 min) before / after": f"{load_before:.2f} / {os.getloadavg()[0]:.2f}",
        "samples": f"{args.rounds} rounds x {args.per_round} calls per operation and "
                   f"language, after {args.warmup} warmup calls; {seconds:.2f} s measured",
    }
    md = "\n".join([f"- {k}: {v}" for k, v in meta.items()] + ["", table(cpp, py), ""])
    print(md)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "cpp": cpp, "python": py}, f, indent=1)


if __name__ == "__main__":
    main()
