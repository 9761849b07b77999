#!/usr/bin/python3
"""What page digests cost the engine and the daemon (server/README.md "Page
digests").

Three hostkvd in one run, each with one pool of 512 KiB pages (MHA, 32
layers, 8 KV heads x 128, bf16, page_size 4, page_first): "digests" with
--verify_hits=1.0 (every hit checked against its digest before Lookup
returns it), "sampled" with the defaults (--verify_hits=0.01) and
"baseline" with --page_digests=false (no digest taken, no hit checked).
One hostkv.Client session on each, with a registered 128 MiB sealed-memfd
device buffer. Each round runs, on each daemon in turn (the order rotating
from round to round):

  publish      Publish of 1,000 fresh pages (one chained call of 1,000 keys)
               into the cache; the digests are taken after it returns, by
               the daemon's digest thread, and the round waits for them
               (untimed for the engine, counted in the daemon's CPU)
  lookup_load  Lookup with acquire of 256 of those keys, Load of the 256
               pages into the device buffer and wait(), Release

Reports per operation the median over rounds of the engine's wall time on
each daemon and the median of the per-round ratios to the baseline
(target: within 1.05x), and the daemon's CPU time (utime + stime of the
hostkvd process from /proc, over the operation and, for publish, until its
digests are taken; summed over the rounds) per GB of pages moved, and its
difference: the CPU the
digests add per GB. Asserts no timing.

  python3 tests/bench/digest_bench.py [--build_dir=build] [--rounds=7]
"""
import bench_env  # noqa: F401,E402 (first: Debian's python3, client/python, build/ defaults)
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LAYERS, KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 4
PUBLISH_PAGES, LOAD_PAGES = 1000, 256
POOL = "digests"


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


class Daemon:
    def __init__(self, binary, hostkv, name, flags):
        self.name = name
        self.workdir = tempfile.mkdtemp(prefix=f"hostkv-digest-bench-{name}-")
        self.sock = os.path.join(self.workdir, "hostkvd.sock")
        self.target = f"unix:{self.sock}"
        self.log_path = os.path.join(self.workdir, "hostkvd.log")
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                [binary, f"--listen={self.target}", "--memory_reserve=256MiB", *flags],
                stdout=log_file, stderr=log_file)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"hostkvd ({name}) exited at start")
            if os.path.exists(self.sock + ".session"):
                try:
                    hostkv.Client(self.target, "probe", connect_timeout=1).close()
                    return
                except hostkv.errors.Unavailable:
                    pass
            time.sleep(0.05)
        sys.exit(f"hostkvd ({name}) did not come up")

    def cpu_seconds(self):
        with open(f"/proc/{self.process.pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


class Engine:
    """One session on one daemon: the pool, a device buffer of LOAD_PAGES
    pages of slots, a chain of fresh keys per round."""

    def __init__(self, hostkv, daemon):
        self.hostkv, self.daemon = hostkv, daemon
        self.client = hostkv.Client(daemon.target, f"digest-bench-{daemon.name}")
        info = self.client.create_pool(hostkv.mha_pool_spec(
            POOL, num_layers=LAYERS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
            page_size=PAGE_SIZE, dtype="bf16", layout="page_first",
            capacity_tokens=(PUBLISH_PAGES + LOAD_PAGES + 64) * PAGE_SIZE))
        self.page_bytes = info.page_bytes
        slots = LOAD_PAGES * PAGE_SIZE
        nbytes = slots * info.token_stride
        self.device = hostkv.shm.SealedBuffer(nbytes * LAYERS * 2)
        handle = self.client.pass_descriptor(self.device.fd)
        k = [hostkv.shm.describe_passed(handle, l * nbytes, nbytes) for l in range(LAYERS)]
        v = [hostkv.shm.describe_passed(handle, (LAYERS + l) * nbytes, nbytes)
             for l in range(LAYERS)]
        self.import_id = self.client.register_device_buffers(POOL, slots, k, v)
        # Pages of random bytes (the digests' cost does not depend on them).
        mapping = self.client.map_pool(POOL)
        mapping.tensor()[:info.total_bytes].random_(0, 256)
        del mapping
        self.chain = 0
        self.lag = []  # seconds from Publish's return until every digest was taken

    def stats(self):
        return self.client.get_pool_stats(POOL).pools[0]

    def wait_digests(self):
        deadline = time.monotonic() + 60
        while self.stats().digests_pending != 0:
            if time.monotonic() > deadline:
                sys.exit(f"{self.daemon.name}: digests still pending after 60 s")
            time.sleep(0.002)

    def publish(self):
        """Seconds the engine's Publish took, and the daemon's CPU seconds
        until its digests were taken."""
        self.chain += 1
        keys = [b"c%06d-k%06d" % (self.chain, i) for i in range(PUBLISH_PAGES)]
        pages = self.client.alloc(POOL, PUBLISH_PAGES * PAGE_SIZE)
        self.keys = keys
        cpu = self.daemon.cpu_seconds()
        t0 = time.perf_counter()
        published = self.client.publish(POOL, "bench", keys, pages)
        wall = time.perf_counter() - t0
        if published.cached != PUBLISH_PAGES:
            sys.exit(f"{self.daemon.name}: {published.cached} pages cached")
        if self.daemon.name != "baseline":  # the baseline takes none
            t1 = time.perf_counter()
            self.wait_digests()
            self.lag.append(time.perf_counter() - t1)
        return wall, self.daemon.cpu_seconds() - cpu

    def lookup_load(self):
        keys = self.keys[:LOAD_PAGES]
        cpu = self.daemon.cpu_seconds()
        t0 = time.perf_counter()
        found = self.client.lookup(POOL, "bench", keys, acquire=True)
        op = self.client.load(POOL, self.import_id, found.pages,
                              [(0, LOAD_PAGES * PAGE_SIZE)])
        self.client.wait(op)
        wall = time.perf_counter() - t0
        cpu = self.daemon.cpu_seconds() - cpu
        if found.hits != LOAD_PAGES:
            sys.exit(f"{self.daemon.name}: {found.hits} hits of {LOAD_PAGES}")
        self.client.release(POOL, found.pages)
        return wall, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build_dir", default=os.path.join(REPO, "build"))
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    os.environ.setdefault("HOSTKV_PROTO_DIR",
                          os.path.join(args.build_dir, "client", "python", "hostkv_proto"))
    import hostkv  # pylint: disable=import-outside-toplevel
    import hostkv.shm  # noqa: F401 pylint: disable=import-outside-toplevel
    binary = os.path.join(args.build_dir, "server", "hostkvd")
    daemons = {"digests": Daemon(binary, hostkv, "digests", ["--verify_hits=1.0"]),
               "sampled": Daemon(binary, hostkv, "sampled", []),
               "baseline": Daemon(binary, hostkv, "baseline", ["--page_digests=false"])}
    try:
        engines = {name: Engine(hostkv, d) for name, d in daemons.items()}
        for e in engines.values():  # warm up: the pool's pages touched once
            e.publish()
            e.lookup_load()
        results = {(name, op): [] for name in engines for op in ("publish", "lookup_load")}
        for r in range(args.rounds):
            names = list(engines)
            order = names[r % 3:] + names[:r % 3]
            for name in order:
                results[(name, "publish")].append(engines[name].publish())
                results[(name, "lookup_load")].append(engines[name].lookup_load())
            log(f"round {r + 1}/{args.rounds}")
        stats = engines["digests"].stats()
        page_bytes = engines["digests"].page_bytes
        print(f"digest bench: {args.rounds} rounds, pages of {page_bytes >> 10} KiB, "
              f"{os.cpu_count()} CPUs; digests taken {stats.digests_computed}, "
              f"hits checked {stats.hits_verified}, unchecked {stats.hits_unverified}, "
              f"mismatches {stats.digest_mismatches}")
        lag = engines["digests"].lag[1:]
        print(f"digests of 1,000 pages taken {statistics.median(lag) * 1e3:.1f} ms (median; "
              f"max {max(lag) * 1e3:.1f}) after Publish returned: the window in which a hit "
              "is served unchecked")
        print("| operation | daemon | engine wall (ms, median) | ratio to baseline (median "
              "of rounds) | daemon CPU per GB (ms) | added CPU per GB (ms) |")
        print("|---|---|---|---|---|---|")
        for op, pages in (("publish", PUBLISH_PAGES), ("lookup_load", LOAD_PAGES)):
            gb = pages * page_bytes / 1e9
            base = results[("baseline", op)]
            # Summed over rounds: /proc counts CPU time in 10 ms ticks.
            base_cpu = sum(x[1] for x in base) / (gb * len(base)) * 1e3
            what = ("Publish of 1,000 pages (+ digests taken after it)" if op == "publish"
                    else "Lookup (acquire) + Load + wait of 256 pages")
            for name, flags in (("digests", "--verify_hits=1.0"),
                                ("sampled", "defaults (--verify_hits=0.01)"),
                                ("baseline", "--page_digests=false")):
                got = results[(name, op)]
                ratio = statistics.median(x[0] / y[0] for x, y in zip(got, base))
                wall = statistics.median(x[0] for x in got) * 1e3
                cpu = sum(x[1] for x in got) / (gb * len(got)) * 1e3
                print(f"| {what} | {flags} | {wall:.2f} | {ratio:.3f}x | {cpu:.0f} | "
                      f"{cpu - base_cpu:.0f} |")
    finally:
        for d in daemons.values():
            d.stop()


if __name__ == "__main__":
    main()
