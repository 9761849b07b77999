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
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import hostkv

OTHER_UID = 61005

# The other uid's scripts' control: `state["go"]` while stdin's last line
# says "go"; `state["end"]` at EOF.
COMMANDS = r"""
state = {"go": False, "end": False}
def commands():
    for line in sys.stdin:
        state["go"] = line.strip() == "go"
    state["end"] = True
threading.Thread(target=commands, daemon=True).start()
"""

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
""" + COMMANDS + r"""
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


# The control: another uid's plain process using `share` cores (1 ms busy
# and the rest of a period asleep, in ceil(share) processes) while stdin says
# "go". What any user of the node may take by running a program, the
# scheduler's fairness: the daemon cannot do better for the honest user than
# its figures beside this.
CONTROL = r"""
import sys, threading, time
duty = float(sys.argv[1])
""" + COMMANDS + r"""
while not state["end"]:
    if not state["go"]:
        time.sleep(0.01)
        continue
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.001:
        pass
    if duty < 1:
        time.sleep(0.001 * (1 - duty) / duty)
"""


def ring_share(flags):
    """The cores of --ring_cpu_per_uid as the daemon reads it (auto: a
    quarter of the CPUs it may use, at least 1)."""
    for flag in flags:
        if flag.startswith("--ring_cpu_per_uid=") and flag.split("=", 1)[1] != "auto":
            return float(flag.split("=", 1)[1])
    return max(1, len(os.sched_getaffinity(0)) // 4)


class Others:
    """The other uid's processes of one kind, told "go" and "stop" together."""

    def __init__(self, argvs, env):
        self.procs = [subprocess.Popen(
            ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
             sys.executable, "-c", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env, cwd="/") for argv in argvs]

    def tell(self, word):
        for proc in self.procs:
            proc.stdin.write(word + "\n")
            proc.stdin.flush()

    def cpu(self):
        return sum(cpu_seconds(proc.pid) for proc in self.procs)

    def end(self):
        for proc in self.procs:
            proc.stdin.close()
        for proc in self.procs:
            proc.wait(timeout=30)


KINDS = ("unattacked", "control", "attacked")


def run(name, flags, attacker_rings, env, phases, phase_seconds):
    workdir = tempfile.mkdtemp(prefix="hostkv-bench-rings-")
    os.chmod(workdir, 0o755)
    daemon, sock = start_daemon(workdir, flags)
    share = ring_share(flags)
    try:
        attacker = Others([(ATTACKER, sock, str(attacker_rings))], env)
        held = int(attacker.procs[0].stdout.readline())
        n = max(1, math.ceil(share)) if share > 0 else 1
        control = Others([(CONTROL, str(min(1.0, share / n) if share > 0 else 1.0))] * n, env)
        others = {"control": control, "attacked": attacker}
        with hostkv.Client("unix:" + sock, "honest") as c:
            assert c.uses_command_ring, "the honest user got no ring"
            c.create_pool(hostkv.mha_pool_spec("bench", num_layers=2, num_kv_heads=2,
                                               head_dim=8, page_size=4, capacity_tokens=4096),
                          delete_with_session=True)
            measure(c, "bench", 0.5)  # warm-up
            got = {kind: {"pair": [], "stats": [], "daemon": 0.0, "other": 0.0, "wall": 0.0}
                   for kind in KINDS}
            for phase in range(phases):
                kind = KINDS[phase % len(KINDS)]
                for what, proc in others.items():
                    proc.tell("go" if what == kind else "stop")
                time.sleep(0.2)  # let the phase settle
                other = others.get(kind)
                d0, o0, t0 = (cpu_seconds(daemon.pid), other.cpu() if other else 0.0,
                              time.monotonic())
                pairs, stats = measure(c, "bench", phase_seconds)
                into = got[kind]
                into["pair"] += pairs
                into["stats"] += stats
                into["daemon"] += cpu_seconds(daemon.pid) - d0
                into["other"] += (other.cpu() - o0) if other else 0.0
                into["wall"] += time.monotonic() - t0
        attacker.end()
        control.end()
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    # Cores the daemon used in each kind of phase (the honest calls' own
    # cost is in all), and the other uid's own processes'.
    cores = {kind: (got[kind]["daemon"] / got[kind]["wall"], got[kind]["other"] / got[kind]["wall"])
             for kind in KINDS if got[kind]["wall"] > 0}
    rows = []
    for what, key in (("Alloc+Free (ring)", "pair"), ("GetPoolStats (gRPC)", "stats")):
        for q in (0.5, 0.99):
            quiet, loaded, attacked = (p(got[kind][key], q) for kind in KINDS)
            rows.append((name, held, f"{what} p{int(q * 100)}", quiet, loaded, attacked))
    return rows, (name, held, share, cores)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--phases", type=int, default=9,
                        help="phases in all, unattacked, control and attacked in turn")
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
    print(f"cpus: {len(os.sched_getaffinity(0))}")
    print("| daemon | attacker's rings | honest call | unattacked µs | beside the control µs "
          "| attacked µs | attacked / unattacked | attacked / control (target <= 1.5) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, held, what, quiet, loaded, attacked in rows:
        print(f"| {name} | {held} | {what} | {quiet:.0f} | {loaded:.0f} | {attacked:.0f} "
              f"| {attacked / quiet:.2f} | {attacked / loaded:.2f} |")
    print()
    print("| daemon | ring share (cores) | daemon's cores unattacked | beside the control "
          "| attacked | control's own cores | attacker's own cores |")
    print("|---|---|---|---|---|---|---|")
    for name, held, share, cores in costs:
        d = {kind: cores.get(kind, (0.0, 0.0)) for kind in KINDS}
        print(f"| {name} | {share:g} | {d['unattacked'][0]:.2f} | {d['control'][0]:.2f} "
              f"| {d['attacked'][0]:.2f} | {d['control'][1]:.2f} | {d['attacked'][1]:.2f} |")


if __name__ == "__main__":
    main()
