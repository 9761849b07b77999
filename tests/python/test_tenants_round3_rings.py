"""Many users on one node: command rings and /metrics, attacked as another
uid against a real hostkvd.

- One uid cannot take every command ring: it gets --max_command_rings_per_uid
  of them, and another user still gets its own.
- A ring's segment is charged to --memory_budget while it runs, and given
  back when its session goes.
- Re-marking ring slots "submitted" (a 4-byte store each) makes the daemon
  spend at most --ring_cpu_per_uid cores on that uid.
- A uid's rings are served by ceil(--ring_cpu_per_uid) threads however many
  it opens, so it cannot have more runnable threads in the daemon than cores
  in its share; they end with its rings.
- Idle TCP connections to /metrics do not keep a scrape from being answered;
  one peer address holds at most --metrics_connections_per_peer of them.
- /metrics' namespace and pool labels are keyed hashes: without the key no
  one can tell which label a name they can guess has.

The other user is a child process under setpriv (needs root).
"""
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import hostkv
import prometheus_text
from hostkv import _command_ring
from conftest import Daemon
from test_cache_access import nobody_env  # noqa: F401  (a fixture)

OTHER_UID = 61005
MiB = 1 << 20

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid"),
    pytest.mark.skipif(not _command_ring.SUPPORTED, reason="the Python ring runs on x86-64 only"),
]

# Runs as the other uid: opens `count` sessions on the session socket, each
# asking for its ring; prints what it got, then holds them until stdin ends.
TAKE_RINGS = r"""
import json, sys
from hostkv import _session_socket, errors
sock_path, count = sys.argv[1], int(sys.argv[2])
held, refused = [], {}
for i in range(count):
    s = _session_socket.connect(sock_path)
    _session_socket.exchange(s, _session_socket.message(
        _session_socket.KIND_OPEN, client_name=b"taker%d" % i))
    try:
        reply = _session_socket.exchange(s, _session_socket.message(
            _session_socket.KIND_OPEN_COMMAND_RING))
        held.append((s, reply.fd))
    except errors.HostKVError as e:
        refused[e.code_name] = refused.get(e.code_name, 0) + 1
        refused["message"] = e.message
        s.close()
print(json.dumps({"rings": len(held), "refused": refused}), flush=True)
sys.stdin.read()
"""

# Runs as the other uid: opens `count` rings, fills every slot with the
# largest Lookup a slot holds and, for `seconds`, marks every answered slot
# "submitted" again, writing back only the request's first 256 bytes (which
# the answer overwrote).
RESUBMIT = r"""
import ctypes, json, mmap, sys, time
from hostkv import _session_socket, _command_ring
from hostkv import pb
sock_path, count, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
SLOTS, SLOT_BYTES = 8, 256 * 1024
request = pb.LookupRequest(pool="p", namespace="n")
while request.ByteSize() + 80 < SLOT_BYTES - 64:
    request.keys.append(b"k" * 48 + str(len(request.keys)).encode())
payload = request.SerializeToString()
rings = []
for i in range(count):
    s = _session_socket.connect(sock_path)
    _session_socket.exchange(s, _session_socket.message(
        _session_socket.KIND_OPEN, client_name=b"resubmitter%d" % i))
    reply = _session_socket.exchange(s, _session_socket.message(
        _session_socket.KIND_OPEN_COMMAND_RING))
    mm = mmap.mmap(reply.fd, reply.value, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    for k in range(SLOTS):
        slot = 64 + k * SLOT_BYTES
        mm[slot + 64:slot + 64 + len(payload)] = payload
        mm[slot + 4:slot + 8] = (5).to_bytes(4, "little")  # kLookup
    doorbell = ctypes.c_uint32.from_buffer(mm, 16)
    rings.append((s, mm, doorbell, ctypes.c_void_p(ctypes.addressof(doorbell))))
print("ready", flush=True)
sys.stdin.readline()
length, head = len(payload).to_bytes(4, "little"), payload[:256]
submissions = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    for s, mm, doorbell, addr in rings:
        for k in range(SLOTS):
            slot = 64 + k * SLOT_BYTES
            if mm[slot:slot + 4] != b"\x01\x00\x00\x00":
                # The answer overwrote the request's first bytes: put them
                # back (256 bytes for the daemon's 256 KiB), and the length.
                mm[slot + 64:slot + 64 + 256] = head
                mm[slot + 8:slot + 12] = length
                mm[slot:slot + 4] = b"\x01\x00\x00\x00"
                submissions += 1
        doorbell.value += 1
        _command_ring._libc.syscall(_command_ring._SYS_FUTEX, addr, 1, 0x7FFFFFFF,
                                    None, None, 0)
    time.sleep(0.001)
print(json.dumps({"submissions": submissions}), flush=True)
"""


@pytest.fixture(scope="module")
def other_env(nobody_env):  # noqa: F811
    """The environment for the other user's client (test_cache_access's)."""
    return nobody_env


def shared_daemon(*flags):
    d = Daemon("--socket_mode=0666", *flags)
    os.chmod(d.workdir, 0o755)  # let the other user reach the socket
    return d


def as_other_user(env, script, *args):
    return subprocess.Popen(
        ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
         sys.executable, "-c", script, *[str(a) for a in args]],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd="/")


def take_rings(env, daemon, count):
    """(the other user's process, what it got)."""
    taker = as_other_user(env, TAKE_RINGS, daemon.sock, count)
    line = taker.stdout.readline()
    assert line, "the other user's client failed"
    return taker, json.loads(line)


def let_go(process):
    process.stdin.close()
    process.wait(timeout=30)


def make_pool(client, name, capacity):
    spec = hostkv.mha_pool_spec(name, num_layers=2, num_kv_heads=2, head_dim=8, page_size=4,
                                capacity_tokens=capacity)
    return client.create_pool(spec, delete_with_session=True)


def alloc_and_free(client, pool, rounds=20):
    for _ in range(rounds):
        pages = client.alloc(pool, 16)
        assert hostkv.count_tokens(pages, 4) == 16
        assert client.free(pool, pages) == 4


def test_one_uid_cannot_take_every_ring(other_env):
    d = shared_daemon("--max_command_rings=24")  # 16 per uid by default
    try:
        taker, got = take_rings(other_env, d, 30)
        try:
            assert got["rings"] == 16, got
            assert got["refused"]["RESOURCE_EXHAUSTED"] == 14, got
            assert "--max_command_rings_per_uid" in got["refused"]["message"], got
            with hostkv.Client(d.target, "victim") as victim:
                assert victim.uses_command_ring
                make_pool(victim, "round3-victim", 256)
                before = victim.command_ring_calls
                alloc_and_free(victim, "round3-victim")
                assert victim.command_ring_calls == before + 40
        finally:
            let_go(taker)
        # Given back with the sessions: the uid gets its 16 again.
        deadline = time.monotonic() + 10
        while True:
            again, got = take_rings(other_env, d, 16)
            let_go(again)
            if got["rings"] == 16 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert got["rings"] == 16, got
        assert d.process.poll() is None
    finally:
        d.stop()


def test_rings_are_charged_to_the_memory_budget(other_env):
    d = shared_daemon("--memory_budget=16MiB")
    try:
        taker, got = take_rings(other_env, d, 16)
        try:
            # 2 MiB and 64 bytes each (and each session's signal records).
            assert 5 <= got["rings"] <= 7, got
            assert got["refused"]["RESOURCE_EXHAUSTED"] == 16 - got["rings"], got
            assert "--memory_budget" in got["refused"]["message"], got
            # The budget the rings hold is not there for a 4 MiB pool.
            with hostkv.Client(d.target, "owner", command_ring=False) as owner:
                with pytest.raises(hostkv.errors.ResourceExhausted):
                    make_pool(owner, "round3-after-rings", 4 * MiB // 128)
        finally:
            let_go(taker)
        # Given back when the sessions went.
        deadline = time.monotonic() + 10
        with hostkv.Client(d.target, "owner", command_ring=False) as owner:
            while True:
                try:
                    make_pool(owner, "round3-after-rings", 4 * MiB // 128)
                    break
                except hostkv.errors.ResourceExhausted:
                    assert time.monotonic() < deadline, "the rings' memory was not given back"
                    time.sleep(0.2)
    finally:
        d.stop()


def process_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_resubmitting_slots_costs_the_daemon_no_more_than_the_uids_cpu_share(other_env):
    share, seconds = 0.25, 4.0
    d = shared_daemon(f"--ring_cpu_per_uid={share}")
    try:
        attacker = as_other_user(other_env, RESUBMIT, d.sock, 16, seconds)
        assert attacker.stdout.readline().strip() == "ready"
        with hostkv.Client(d.target, "victim") as victim:
            assert victim.uses_command_ring
            make_pool(victim, "round3-cpu", 256)
            before = process_cpu_seconds(d.process.pid)
            attacker.stdin.write("go\n")
            attacker.stdin.flush()
            # The victim's own ring keeps working beside it.
            calls = victim.command_ring_calls
            alloc_and_free(victim, "round3-cpu", rounds=50)
            assert victim.command_ring_calls == calls + 100
            out = json.loads(attacker.stdout.readline())
            used = process_cpu_seconds(d.process.pid) - before
        attacker.stdin.close()
        attacker.wait(timeout=30)
        assert out["submissions"] > 50, out
        # The attacker's uid: `share` cores for the window and the 50 ms
        # burst; the rest is the victim's calls and the daemon's own.
        assert used < share * seconds + 0.6, (used, out)
        assert d.process.poll() is None
    finally:
        d.stop()


def daemon_threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def kernel_waits_on_many():
    """Whether futex_waitv (Linux 5.16) exists: without it a thread per ring."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall(449, None, 0, 0, None, 1)  # SYS_futex_waitv on x86-64
    return ctypes.get_errno() != 38  # ENOSYS


@pytest.mark.parametrize("share,threads", [("1", 1), ("2", 2), ("0", 16)])
def test_a_uids_rings_run_on_as_many_threads_as_cores_in_its_share(other_env, share, threads):
    if share != "0" and not kernel_waits_on_many():
        pytest.skip("no futex_waitv: the daemon serves each ring on its own thread")
    d = shared_daemon(f"--ring_cpu_per_uid={share}")
    try:
        before = daemon_threads(d.process.pid)
        taker, got = take_rings(other_env, d, 16)
        try:
            assert got["rings"] == 16, got
            assert daemon_threads(d.process.pid) - before == threads
        finally:
            let_go(taker)
        # The threads end with the rings.
        deadline = time.monotonic() + 10
        while daemon_threads(d.process.pid) > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert daemon_threads(d.process.pid) == before
    finally:
        d.stop()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port, timeout):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.status, r.read().decode()


def test_idle_connections_do_not_starve_a_scrape():
    port = free_port()
    d = Daemon(f"--metrics_listen=127.0.0.1:{port}")
    idle = []
    try:
        # 64 peers (loopback addresses) each holding a connection that says
        # nothing: a scrape is still answered at once.
        for i in range(64):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i}", 0))
            s.connect(("127.0.0.1", port))
            idle.append(s)
        time.sleep(0.2)
        status, body = scrape(port, timeout=5)  # Prometheus waits 10 s
        assert status == 200
        families = prometheus_text.parse(body)
        assert "hostkv_memory_budget_bytes" in families, sorted(families)
    finally:
        for s in idle:
            s.close()
        d.stop()


def test_one_peer_holds_few_metrics_connections():
    port = free_port()
    d = Daemon(f"--metrics_listen=127.0.0.1:{port}", "--metrics_connections_per_peer=4")
    held = []
    try:
        for _ in range(10):
            held.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(0.5)
        closed = 0
        for s in held:  # all at once: well within the 2 s head deadline
            try:
                closed += s.recv(1, socket.MSG_DONTWAIT) == b""
            except ConnectionResetError:
                closed += 1
            except BlockingIOError:
                pass  # open, waiting for its request
        assert closed == 6, closed
        # The peer's next connection, once its idle ones are gone, is served.
        for s in held:
            s.close()
        time.sleep(0.3)
        assert scrape(port, timeout=5)[0] == 200
    finally:
        for s in held:
            s.close()
        d.stop()


def test_metrics_labels_cannot_be_matched_to_names_without_the_key():
    """A namespace hostkv.vllm derives from a model name, and its pool: the
    label is neither the name nor its plain SHA-256, and differs between
    two daemons with their own (random) keys."""
    name_space = "vllm:meta-llama/Llama-3.1-8B:tp1pp1:r0:0123456789abcdef"
    pool = "vllm-0123456789abcdef-r0"
    labels = []
    for _ in range(2):
        port = free_port()
        d = Daemon(f"--metrics_listen=127.0.0.1:{port}")
        try:
            with hostkv.Client(d.target, "labels") as c:
                make_pool(c, pool, 256)
                runs = c.alloc(pool, 4)
                assert c.publish(pool, name_space, [b"k0"], runs).cached == 1
                _, body = scrape(port, timeout=5)
            families = prometheus_text.parse(body)
            samples = families["hostkv_cache_cached_pages"]["samples"]
            assert len(samples) == 1, samples
            got = samples[0][1]
            for plain in (name_space, pool):
                assert plain not in body
                assert hashlib.sha256(plain.encode()).hexdigest()[:12] not in body
            labels.append((got["namespace"], got["pool"]))
        finally:
            d.stop()
    assert labels[0] != labels[1], labels
