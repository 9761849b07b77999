"""What a hostkvd restart costs (deploy/README.md "Restarts and upgrades"): the time a
new daemon takes to adopt N pages (half of them a session's, a quarter
cached with their keys) beside the baselines measured in the same run (the
same daemon starting without state, and creating the same pool), and the
pause an engine sees from the kill to its session's first answered call,
and how soon after a restarted daemon listens a call made during a 0.5 s
outage returns (beside a fresh client's first call, the baseline).

  HOSTKVD=build/server/hostkvd HOSTKV_PROTO_DIR=build/client/python/hostkv_proto \\
  PYTHONPATH=client/python python3 tests/bench/restart_bench.py [--pages=1024,65536,524288]

Prints a Markdown table."""
import bench_env  # noqa: F401,E402 (first: Debian's python3, client/python, build/ defaults)
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time

import hostkv

KEYS_PER_CALL = 65536


def start(binary, sock, log):
    t0 = time.monotonic()
    p = subprocess.Popen([binary, f"--listen=unix:{sock}", "--memory_reserve=0",
                          "--log_level=" + os.environ.get("BENCH_LOG_LEVEL", "warning")], stdout=log, stderr=log)
    while True:
        assert p.poll() is None, "hostkvd exited"
        if os.path.exists(sock + ".session"):
            try:
                hostkv.Client("unix:" + sock, "probe", connect_timeout=1,
                              reconnect_timeout=0).close()
                return p, time.monotonic() - t0
            except hostkv.errors.HostKVError:
                pass
        time.sleep(0.005)


def run(binary, pages):
    work = tempfile.mkdtemp(prefix="hostkv-restart-bench-")
    sock = os.path.join(work, "hostkvd.sock")
    log = open(os.path.join(work, "log"), "w")
    try:
        d, cold_start = start(binary, sock, log)
        c = hostkv.Client("unix:" + sock, "engine", reconnect_timeout=60)
        spec = hostkv.mha_pool_spec("bench", 1, 1, 8, 1, capacity_tokens=pages)
        t0 = time.monotonic()
        c.create_pool(spec)
        create = time.monotonic() - t0
        owned = c.alloc("bench", pages // 2)
        cached = c.alloc("bench", pages // 4)
        flat = [p for first, n in cached for p in range(first, first + n)]
        for i in range(0, len(flat), KEYS_PER_CALL):
            chunk = flat[i:i + KEYS_PER_CALL]
            c.publish("bench", "ns", [b"k%d" % p for p in chunk],
                      [(p, 1) for p in chunk])
        d.send_signal(signal.SIGKILL)
        d.wait()
        t_kill = time.monotonic()
        d, warm_start = start(binary, sock, log)
        try:
            c.alloc("bench", 1)  # the engine's next call: resumes its session
            pause = time.monotonic() - t_kill
        except hostkv.errors.NotFound:
            pause = float("nan")  # a client that does not resume
        stats = hostkv.Client("unix:" + sock, "operator").get_pool_stats("bench")
        r = stats.restart
        assert r.pages_adopted >= pages // 2 and r.cached_pages_adopted == len(flat), r
        with hostkv.Client("unix:" + sock, "reader") as reader:
            assert reader.lookup("bench", "ns", [b"k%d" % flat[-1]]).hits == 1
        try:
            c.close()
        except hostkv.errors.HostKVError:
            pass
        d.send_signal(signal.SIGTERM)
        d.wait()
        return dict(pages=pages, cold_start=cold_start, create=create,
                    adopt=r.adopt_seconds, warm_start=warm_start, pause=pause)
    finally:
        log.close()
        if os.environ.get("BENCH_LOG_LEVEL"):
            print(open(os.path.join(work, "log")).read())
        shutil.rmtree(work, ignore_errors=True)


def listening_at(sock):
    """Polls until a connect to the gRPC socket succeeds; returns when."""
    while True:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(sock)
            return time.monotonic()
        except OSError:
            time.sleep(0.0005)
        finally:
            probe.close()


def outage(binary, rounds=5, down=0.5):
    """A call made while the daemon is down for `down` s: how long after
    the next daemon listens it returns, and a fresh client's first answer
    measured from the same instant (baseline)."""
    work = tempfile.mkdtemp(prefix="hostkv-outage-bench-")
    sock = os.path.join(work, "hostkvd.sock")
    log = open(os.path.join(work, "log"), "w")
    late, fresh = [], []
    try:
        d, _ = start(binary, sock, log)
        c = hostkv.Client("unix:" + sock, "engine", reconnect_timeout=60)
        c.create_pool(hostkv.mha_pool_spec("outage", 1, 1, 8, 1, capacity_tokens=1024))
        for _ in range(rounds):
            d.send_signal(signal.SIGKILL)
            d.wait()
            returned = {}

            def call():
                runs = c.alloc("outage", 1)
                returned["at"] = time.monotonic()
                c.free("outage", runs)

            caller = threading.Thread(target=call)
            caller.start()
            time.sleep(down)
            d = subprocess.Popen([binary, f"--listen=unix:{sock}", "--memory_reserve=0",
                                  "--log_level=warning"], stdout=log, stderr=log)
            listening = listening_at(sock)
            hostkv.Client("unix:" + sock, "probe", connect_timeout=5,
                          reconnect_timeout=0).close()
            fresh.append(time.monotonic() - listening)
            caller.join()
            late.append(returned["at"] - listening)
        c.close()
        d.send_signal(signal.SIGTERM)
        d.wait()
    finally:
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    return late, fresh


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", default="1024,65536,524288")
    args = parser.parse_args()
    binary = os.environ["HOSTKVD"]
    print("| pages | adopt | create the pool (baseline) | start with state | start without state (baseline) | ratio | engine pause (kill -> next call answered) |")
    print("|--:|--:|--:|--:|--:|--:|--:|")
    for n in [int(x) for x in args.pages.split(",")]:
        r = run(binary, n)
        print(f"| {r['pages']:,} | {r['adopt'] * 1e3:.1f} ms | {r['create'] * 1e3:.1f} ms "
              f"| {r['warm_start'] * 1e3:.0f} ms | {r['cold_start'] * 1e3:.0f} ms "
              f"| {r['warm_start'] / r['cold_start']:.2f}x | {r['pause'] * 1e3:.0f} ms |")
    late, fresh = outage(binary)
    print()
    print("| a call made during a 0.5 s outage | returned after the daemon listened "
          "(median, max of 5) | a fresh client's connect + first call (baseline) | ratio |")
    print("|---|--:|--:|--:|")
    print(f"| Client.alloc | {statistics.median(late) * 1e3:.0f} ms, {max(late) * 1e3:.0f} ms "
          f"| {statistics.median(fresh) * 1e3:.0f} ms "
          f"| {statistics.median(late) / statistics.median(fresh):.2f}x |")


if __name__ == "__main__":
    main()
