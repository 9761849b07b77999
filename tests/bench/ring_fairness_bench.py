"""An honest user's calls beside another uid that re-marks command-ring slots
"submitted" as fast as it can (issue 38, R2): the honest user's Alloc+Free
through its own ring, and a GetPoolStats over gRPC, with the attacker idle
and attacking, in alternating phases of the same run against the same
daemon, reported as the ratio attacked / unattacked (target: <= 1.5).

Each daemon configuration is its own run: the defaults
(--max_command_rings_per_uid=16, --ring_cpu_per_uid=1), and the daemon
without per-uid bounds (--max_command_rings_per_uid=256
--ring_cpu_per_uid=0), which is how it behaved before them, the attacker
then holding 200 rings.

  HOSTKVD=build/server/hostkvd HOSTKV_PROTO_DIR=build/client/python/hostkv_proto \\
  PYTHONPATH=client/python sudo -E python3 tests/bench/ring_fairness_bench.py \\
      [--phases=6] [--phase_seconds=2]

Needs root (the attacker runs as uid 61005 under setpriv). Prints a
Markdown table."""
import bench_env  # noqa: F401,E402 (first: Debian's python3, client/python, build/ defaults)
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import hostkv

OTHER_UID = 61005

# The attacker: opens `count` rings (as many as it is given), fills every
# slot with the largest Lookup a slot holds, then marks every answered slot
# "submitted" again (writing back the request's first 256 bytes, which the
# answer overwrote) while stdin says "go" (until "stop"; EOF ends it).
ATTACKER = r"""
import ctypes, mmap, sys, threading, time
from hostkv import _session_socket, _command_ring, errors, pb
sock_path, count = sys.argv[1], int(sys.argv[2])
SLOTS, SLOT_BYTES = 8, 256 * 1024
request = pb.LookupRequest(pool="p", namespace="n")
while request.ByteSize() + 80 < SLOT_BYTES - 64:
    request.keys.append(b"k" * 48 + str(len(request.keys)).encode())
payload = request.SerializeToString()
rings = []
for i in range(count):
    s = _session_socket.connect(sock_path)
    _session_socket.exchange(s, _session_socket.message(
        _session_socket.KIND_OPEN, client_name=b"attacker%d" % i))
    try:
        reply = _session_socket.exchange(s, _session_socket.message(
            _session_socket.KIND_OPEN_COMMAND_RING))
    except errors.HostKVError:
        s.close()
        break
    mm = mmap.mmap(reply.fd, reply.value, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    for k in range(SLOTS):
        slot = 64 + k * SLOT_BYTES
        mm[slot + 64:slot + 64 + len(payload)] = payload
        mm[slot + 4:slot + 8] = (5).to_bytes(4, "little")
    doorbell = ctypes.c_uint32.from_buffer(mm, 16)
    rings.append((s, mm, doorbell, ctypes.c_void_p(ctypes.addressof(doorbell))))
print(len(rings), flush=True)
state = {"go": False, "end": False}
def commands():
    for line in sys.stdin:
        state["go"] = line.strip() == "go"
    state["end"] = True
threading.Thread(target=commands, daemon=True).start()
length, head = len(payload).to_bytes(4, "little"), payload[:256]
while not state["end"]:
    if not state["go"]:
        time.sleep(0.01)
        continue
    for s, mm, doorbell, addr in rings:
        for k in range(SLOTS):
            slot = 64 + k * SLOT_BYTES
            if mm[slot:slot + 4] != b"\x01\x00\x00\x00":
                # The answer overwrote the request's first bytes: put them
                # back (256 bytes for the daemon's 256 KiB), and the length.
                mm[slot + 64:slot + 64 + 256] = head
                mm[slot + 8:slot + 12] = length
                mm[slot:slot + 4] = b"\x01\x00\x00\x00"
        doorbell.value += 1
        _command_ring._libc.syscall(_command_ring._SYS_FUTEX, addr, 1, 0x7FFFFFFF,
                                    None, None, 0)
    time.sleep(0.001)
"""


def attacker_env():
    root = tempfile.mkdtemp(prefix="hostkv-bench-attacker-")
    shutil.copytree(os.path.dirname(hostkv.__file__), os.path.join(root, "hostkv"))
    env = dict(os.environ, PYTHONPATH=root)
    if os.environ.get("HOSTKV_PROTO_DIR"):
        env["HOSTKV_PROTO_DIR"] = os.path.join(root, "proto")
        shutil.copytree(os.environ["HOSTKV_PROTO_DIR"], env["HOSTKV_PROTO_DIR"])
    for base, _, files in os.walk(root):
        os.chmod(base, 0o755)
        for name in files:
            os.chmod(os.path.join(base, name), 0o644)
    return root, env


def start_daemon(workdir, flags):
    sock = os.path.join(workdir, "hostkvd.sock")
    log = open(os.path.join(workdir, "hostkvd.log"), "w")
    p = subprocess.Popen([os.environ.get("HOSTKVD", "build/server/hostkvd"),
                          f"--listen=unix:{sock}", "--memory_reserve=0", "--socket_mode=0666",
                          "--log_level=warning", *flags], stdout=log, stderr=log)
    deadline = time.monotonic() + 20
    while not os.path.exists(sock + ".session"):
        assert p.poll() is None and time.monotonic() < deadline, "hostkvd did not start"
        time.sleep(0.05)
    return p, sock


def measure(client, pool, seconds):
    """(Alloc+Free latencies, GetPoolStats latencies) in µs for `seconds`."""
    pairs, stats = [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        pages = client.alloc(pool, 16)
        client.free(pool, pages)
        t1 = time.perf_counter()
        client.get_pool_stats(pool)
        t2 = time.perf_counter()
        pairs.append((t1 - t0) * 1e6)
        stats.append((t2 - t1) * 1e6)
    return pairs, stats


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run(name, flags, attacker_rings, env, phases, phase_seconds):
    workdir = tempfile.mkdtemp(prefix="hostkv-bench-rings-")
    os.chmod(workdir, 0o755)
    daemon, sock = start_daemon(workdir, flags)
    try:
        attacker = subprocess.Popen(
            ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
             sys.executable, "-c", ATTACKER, sock, str(attacker_rings)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd="/")
        held = int(attacker.stdout.readline())
        with hostkv.Client("unix:" + sock, "honest") as c:
            assert c.uses_command_ring, "the honest user got no ring"
            c.create_pool(hostkv.mha_pool_spec("bench", num_layers=2, num_kv_heads=2,
                                               head_dim=8, page_size=4, capacity_tokens=4096),
                          delete_with_session=True)
            measure(c, "bench", 0.5)  # warm-up
            quiet = {"pair": [], "stats": [], "daemon": 0.0, "attacker": 0.0, "wall": 0.0}
            loud = {"pair": [], "stats": [], "daemon": 0.0, "attacker": 0.0, "wall": 0.0}
            for phase in range(phases):
                attacking = phase % 2 == 1
                attacker.stdin.write("go\n" if attacking else "stop\n")
                attacker.stdin.flush()
                time.sleep(0.2)  # let the phase settle
                d0, a0, t0 = cpu_seconds(daemon.pid), cpu_seconds(attacker.pid), time.monotonic()
                pairs, stats = measure(c, "bench", phase_seconds)
                into = loud if attacking else quiet
                into["pair"] += pairs
                into["stats"] += stats
                into["daemon"] += cpu_seconds(daemon.pid) - d0
                into["attacker"] += cpu_seconds(attacker.pid) - a0
                into["wall"] += time.monotonic() - t0
        attacker.stdin.close()
        attacker.wait(timeout=30)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    # Cores the daemon used, unattacked and attacked (the honest calls' own
    # cost is in both), and the attacker's own.
    daemon_cores = (quiet["daemon"] / quiet["wall"], loud["daemon"] / loud["wall"])
    attacker_cores = loud["attacker"] / loud["wall"]
    rows = []
    for what, key in (("Alloc+Free (ring)", "pair"), ("GetPoolStats (gRPC)", "stats")):
        for q in (0.5, 0.99):
            base, value = p(quiet[key], q), p(loud[key], q)
            rows.append((name, held, f"{what} p{int(q * 100)}", base, value, value / base))
    return rows, (name, held, daemon_cores, attacker_cores)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--phases", type=int, default=6)
    parser.add_argument("--phase_seconds", type=float, default=2.0)
    parser.add_argument("--daemon_flags", default="",
                        help="extra flags of the first daemon (e.g. --ring_cpu_per_uid=0.5)")
    parser.add_argument("--skip_unbounded", action="store_true",
                        help="only the first daemon")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: the attacker runs as another uid")
    root, env = attacker_env()
    try:
        flags = args.daemon_flags.split()
        rows, cost = run(" ".join(flags) or "defaults", flags, 200, env, args.phases,
                         args.phase_seconds)
        costs = [cost]
        if not args.skip_unbounded:
            more, cost = run("no per-uid bounds (as before)",
                             ["--max_command_rings_per_uid=256", "--ring_cpu_per_uid=0"], 200,
                             env, args.phases, args.phase_seconds)
            rows += more
            costs.append(cost)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"cpus: {os.cpu_count()}")
    print("| daemon | attacker's rings | honest call | unattacked µs | attacked µs | ratio (target <= 1.5) |")
    print("|---|---|---|---|---|---|")
    for name, held, what, base, value, ratio in rows:
        print(f"| {name} | {held} | {what} | {base:.0f} | {value:.0f} | {ratio:.2f} |")
    print()
    print("| daemon | attacker's rings | daemon's cores unattacked | attacked | attacker's own cores |")
    print("|---|---|---|---|---|")
    for name, held, (quiet, loud), attacker_cores in costs:
        print(f"| {name} | {held} | {quiet:.2f} | {loud:.2f} | {attacker_cores:.2f} |")


if __name__ == "__main__":
    main()
