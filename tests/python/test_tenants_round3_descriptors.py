"""Many users on one node, round 3 (issue 38): what one user passes over the
session socket, and what listens beside the daemon's socket, against a real
hostkvd, the attacker running as another uid.

- A flood of refused descriptors (records of 253 copies of a pipe end), the
  uid's closes first stalled by a Unix socket holding a TCP socket lingering
  an hour: the daemon's descriptors stay bounded and another user's new
  client connects and passes its memfd, during the attack and after it.
- One uid cannot hold every passed-descriptor slot (--max_passed_fds_per_uid,
  at most a quarter of all), and gets its slots back when its sessions go.
- A resume after a restart counts toward --max_sessions_per_uid.
- In a sticky world-writable socket directory, another user's listener on
  <socket>.state neither stops hostkvd nor keeps a standalone keeper waiting;
  --takeover signals nothing that is not a hostkvd of its own uid.
"""
import fcntl
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import hostkv
from conftest import Daemon, hostkvd_binary

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run the attacker as another uid")

OTHER_UID = 61005
RESOURCE_EXHAUSTED, INVALID_ARGUMENT = 8, 3

# The session socket's records, spoken raw (proto/contract/session_socket.h):
# prepended to every script the attacker runs.
RAW = r"""
import array, errno, json, os, socket, struct, sys, time
MSG = struct.Struct("=IIII16s216sQ")
REPLY = struct.Struct("=IIQ16sIIII208s")
OPEN, PASS_FD, RESUME = 1, 3, 6

def record(kind, session_id=b""):
    return MSG.pack(0x32564B48, 2, kind, os.getpid(), session_id, b"attacker", 0)

def rights(fds):
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]

def reply(sock, flags=0):
    data, anc, _, _ = sock.recvmsg(256, socket.CMSG_SPACE(253 * 4), flags)
    for level, kind, d in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            for fd in array.array("i", d[:len(d) - len(d) % 4]):
                os.close(fd)
    if len(data) != 256:
        return None
    f = REPLY.unpack(data)
    return f[0], f[3].hex(), f[8].split(b"\0")[0].decode()

def session(path, kind=OPEN, session_id=b""):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    s.sendmsg([record(kind, session_id)])
    return s, reply(s)

def memfd():
    fd = os.memfd_create("attacker", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4096)
    import fcntl
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd
"""

# Stalls its uid's closes with a TCP socket lingering an hour (SO_LINGER
# {1, 3600}, a zero window: its peer never reads) whose only reference
# travels inside a Unix socket, then floods records of 253 copies of a pipe
# end from 16 connections for argv[2] seconds. Stays (and the linger with
# it) until its stdin closes.
FLOOD = RAW + r"""
path, seconds = sys.argv[1], float(sys.argv[2])
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(1)
tcp = socket.socket()
tcp.connect(listener.getsockname())
peer, _ = listener.accept()
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 3600))
tcp.setblocking(False)
try:
    while True:
        tcp.send(b"x" * 65536)
except BlockingIOError:
    pass
holder, carrier = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
carrier.sendmsg([b"x"], rights([tcp.fileno()]))
tcp.close()
carrier.close()
first, opened = session(path)
assert opened[0] == 0, opened
first.sendmsg([record(PASS_FD)], rights([holder.fileno()]))
holder.close()
print(json.dumps({"holder": reply(first)[0]}), flush=True)
read_end, write_end = os.pipe()
flood, copies = record(PASS_FD), rights([read_end] * 253)
# Its share first, a record at a time: then what does the kernel say?
first.setblocking(False)
outcome, sent = "sent", 0
for _ in range(8):
    try:
        first.sendmsg([flood], copies)
        sent += 1
    except OSError as e:
        outcome = errno.errorcode[e.errno]
        break
    time.sleep(0.1)
conns = [first] + [session(path)[0] for _ in range(15)]
for c in conns:
    c.setblocking(False)
stats = {"past_share": outcome, "sent": sent, "refused": 0, "full": 0, "other": 0}
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    for c in conns:
        try:
            c.sendmsg([flood], copies)
            stats["sent"] += 1
        except BlockingIOError:
            stats["full"] += 1
        except PermissionError:
            stats["refused"] += 1  # the kernel refused them for the daemon
        except OSError:
            stats["other"] += 1
        try:
            while reply(c, socket.MSG_DONTWAIT) is not None:
                pass
        except (BlockingIOError, OSError):
            pass
print(json.dumps(stats), flush=True)
sys.stdin.read()
"""

# Passes sealed memfds from up to 8 sessions until refused; prints how many
# the daemon took and the refusal; stays until its stdin closes.
HOARD = RAW + r"""
path = sys.argv[1]
taken, refusal, conns = 0, None, []
for _ in range(8):
    c, opened = session(path)
    assert opened[0] == 0, opened
    conns.append(c)
    for _ in range(64):
        fd = memfd()
        c.sendmsg([record(PASS_FD)], rights([fd]))
        os.close(fd)
        code, _, message = reply(c)
        if code != 0:
            refusal = (code, message)
            break
        taken += 1
    if refusal is not None:
        break
print(json.dumps({"taken": taken, "refusal": refusal}), flush=True)
sys.stdin.read()
"""

# Opens argv[2] sessions and prints their secrets; stays until stdin closes.
OPEN_SESSIONS = RAW + r"""
path, n = sys.argv[1], int(sys.argv[2])
conns, secrets = [], []
for _ in range(n):
    c, opened = session(path)
    assert opened[0] == 0, opened
    conns.append(c)
    secrets.append(opened[1])
print(json.dumps(secrets), flush=True)
sys.stdin.read()
"""

# Opens argv[2] fresh sessions, then resumes the secrets in argv[3:]; prints
# the codes of the resumes.
RESUME_SESSIONS = RAW + r"""
path, n = sys.argv[1], int(sys.argv[2])
conns = []
for _ in range(n):
    c, opened = session(path)
    assert opened[0] == 0, opened
    conns.append(c)
out = []
for secret in sys.argv[3:]:
    c, resumed = session(path, RESUME, bytes.fromhex(secret))
    conns.append(c)
    out.append([resumed[0], resumed[2]])
print(json.dumps(out), flush=True)
"""

# Listens on argv[1] (a SOCK_SEQPACKET socket) until its stdin closes; with
# argv[2] == "full", never accepts and fills its backlog first, so that a
# blocking connect(2) would wait for ever.
SQUAT = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(sys.argv[1])
full = len(sys.argv) > 2 and sys.argv[2] == "full"
s.listen(0 if full else 16)
held = []
while full:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK)
    try:
        c.connect(sys.argv[1])
    except BlockingIOError:
        break
    held.append(c)
print("listening", flush=True)
sys.stdin.read()
"""


def attacker(script, *args):
    """Runs `script` as OTHER_UID (setpriv: no fork hooks of gRPC's in the
    child); the caller reads its stdout lines and closes its stdin to let
    it go."""
    return subprocess.Popen(["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}",
                             "--clear-groups", sys.executable, "-c", script,
                             *map(str, args)],
                            cwd="/", text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def let_go(process):
    process.stdin.close()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def read_json(process):
    line = process.stdout.readline()
    assert line, process.stderr.read() if process.poll() is not None else "no output"
    return json.loads(line)


def open_descriptors(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def sealed_memfd():
    fd = os.memfd_create("bystander", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4096)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def kernel_refuses_descriptors():
    """Whether the kernel has SO_PASSRIGHTS (Linux 6.16)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, 83, 0)
            return True
        except OSError:
            return False


def wait_until(predicate, seconds=20):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def a_bystander_is_served(daemon):
    """Another user's new client: connects, lists pools (gRPC), passes its
    memfd over a new session socket."""
    with hostkv.Client(daemon.target, "bystander", connect_timeout=5) as c:
        c.list_pools()
        fd = sealed_memfd()
        try:
            assert c.pass_descriptor(fd) > 0
        finally:
            os.close(fd)


def shared_daemon(*flags):
    d = Daemon("--socket_mode=0666", *flags)
    os.chmod(d.workdir, 0o755)  # the other user reaches the socket
    return d


# -- D1: refused descriptors cannot fill the daemon's table or block it -----

def test_a_flood_of_refused_descriptors_behind_a_stalled_close_leaves_others_served():
    daemon = shared_daemon()
    try:
        pid = daemon.process.pid
        before = open_descriptors(pid)
        flood = attacker(FLOOD, daemon.sock + ".session", 3)
        try:
            assert read_json(flood) == {"holder": INVALID_ARGUMENT}
            stats = read_json(flood)
            during = open_descriptors(pid)
            assert stats["sent"] > 0, stats
            # The uid's refused descriptors wait in its share of the closer
            # (--max_refused_fds_per_uid, 1024) and its 16 connections; the
            # rest never leave the attacker's sockets. Before: ~19,000.
            assert during - before < 1024 + 2 * 253 + 64, (before, during, stats)
            if kernel_refuses_descriptors():
                # Past the uid's share its connections refuse descriptors.
                assert stats["past_share"] == "EPERM", stats
            a_bystander_is_served(daemon)
        finally:
            let_go(flood)
        # Gone: the linger ends with its peer, and every descriptor of the
        # attacker's is closed.
        assert wait_until(lambda: open_descriptors(pid) < before + 16), \
            (before, open_descriptors(pid))
        a_bystander_is_served(daemon)
        assert daemon.process.poll() is None
    finally:
        daemon.stop()


# -- E1: passed-descriptor slots per uid -------------------------------------

@pytest.fixture
def small_descriptor_limit(tmp_path, monkeypatch):
    """hostkvd under RLIMIT_NOFILE 1024: 128 passed-descriptor slots in all
    (an eighth, server/operations/descriptor_shares.h), 32 per uid."""
    wrapper = tmp_path / "hostkvd-1024"
    wrapper.write_text(f'#!/bin/sh\nexec prlimit --nofile=1024:1024 {hostkvd_binary()} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("HOSTKVD", str(wrapper))


def test_one_uid_cannot_take_every_passed_descriptor_slot(small_descriptor_limit):
    daemon = shared_daemon()
    try:
        hoard = attacker(HOARD, daemon.sock + ".session")
        try:
            result = read_json(hoard)
            # A quarter of the 128 slots; before the per-uid bound: all of
            # them, and the bystander's pass refused.
            assert result["taken"] == 32, result
            assert result["refusal"][0] == RESOURCE_EXHAUSTED
            assert "--max_passed_fds_per_uid" in result["refusal"][1], result
            a_bystander_is_served(daemon)
        finally:
            let_go(hoard)
        # Its sessions ended with their connections: the slots are back.
        def takes_all_again():
            again = attacker(HOARD, daemon.sock + ".session")
            try:
                return read_json(again)["taken"] == 32
            finally:
                let_go(again)
        assert wait_until(takes_all_again, seconds=30)
    finally:
        daemon.stop()


# -- a resume counts toward --max_sessions_per_uid ---------------------------

def test_resumes_count_toward_the_sessions_of_their_uid():
    daemon = shared_daemon("--max_sessions_per_uid=4")
    try:
        first = attacker(OPEN_SESSIONS, daemon.sock + ".session", 4)
        secrets = read_json(first)
        daemon.kill()  # the sessions survive in the state keeper
        let_go(first)
        daemon.restart()
        # Four new sessions, then the four old ones resumed: eight open for a
        # uid allowed four. Before: every resume succeeded.
        second = attacker(RESUME_SESSIONS, daemon.sock + ".session", 4, *secrets)
        try:
            resumed = read_json(second)
        finally:
            let_go(second)
        assert [code for code, _ in resumed] == [RESOURCE_EXHAUSTED] * 4, resumed
        assert all("--max_sessions_per_uid" in message for _, message in resumed)
    finally:
        daemon.stop()


# -- S1: listeners of another user beside the socket -------------------------

@pytest.fixture
def sticky_dir():
    """A sticky world-writable directory, as /tmp."""
    path = tempfile.mkdtemp(prefix="hostkv-sticky-")
    os.chmod(path, 0o1777)
    yield path
    subprocess.run(["rm", "-rf", path])


def squat(path, *how):
    process = attacker(SQUAT, path, *how)
    assert process.stdout.readline() == "listening\n", process.stderr.read()
    assert os.stat(path).st_uid == OTHER_UID
    return process


def start_hostkvd(sock, *flags):
    return subprocess.Popen([hostkvd_binary(), "--memory_reserve=256MiB",
                             f"--listen=unix:{sock}", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def start_and_wait_serving(sock):
    daemon = start_hostkvd(sock)

    def serves():
        assert daemon.poll() is None, daemon.stdout.read()
        try:
            hostkv.Client(f"unix:{sock}", "probe", connect_timeout=1).close()
            return True
        except hostkv.errors.Unavailable:
            return False
    return daemon, wait_until(serves)


def stop_hostkvd(daemon):
    daemon.terminate()
    return daemon.communicate(timeout=20)[0]


def test_another_users_listener_on_the_keepers_path_does_not_stop_hostkvd(sticky_dir):
    sock = os.path.join(sticky_dir, "hostkvd.sock")
    squatter = squat(sock + ".state")
    daemon, served = start_and_wait_serving(sock)
    try:
        # It serves (its state not kept); before: it exited at start.
        assert served
        # A standalone keeper does not wait for the listener for ever.
        keeper = subprocess.run([hostkvd_binary(), f"--state_keeper={sock}.state"],
                                capture_output=True, text=True, timeout=20)
        assert keeper.returncode == 1, keeper
        assert f"uid {OTHER_UID}" in keeper.stdout + keeper.stderr
    finally:
        out = stop_hostkvd(daemon)
        let_go(squatter)
    assert f"{sock}.state" in out and f"uid {OTHER_UID}" in out, out


def test_a_listener_that_never_accepts_on_the_keepers_path_is_not_waited_for(sticky_dir):
    """Its backlog full, a connect(2) would wait for ever: hostkvd gives up
    on it after 5 s (root then removes it from the sticky directory and
    starts its own keeper) and serves."""
    sock = os.path.join(sticky_dir, "hostkvd.sock")
    squatter = squat(sock + ".state", "full")
    daemon, served = start_and_wait_serving(sock)
    try:
        assert served
    finally:
        stop_hostkvd(daemon)
        let_go(squatter)


@pytest.mark.parametrize("how", ["accepting", "full"])
def test_takeover_signals_no_listener_of_another_uid(sticky_dir, how):
    sock = os.path.join(sticky_dir, "hostkvd.sock")
    squatter = squat(sock + ".session", how)
    try:
        out = subprocess.run([hostkvd_binary(), "--memory_reserve=256MiB",
                              f"--listen=unix:{sock}", "--takeover"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode != 0
        said = out.stderr + out.stdout
        if how == "accepting":
            assert f"uid {OTHER_UID}" in said, said
        else:
            assert f"no hostkvd answers on {sock}.session" in said, said
        # Still there: not SIGTERMed (before: it was).
        time.sleep(0.2)
        assert squatter.poll() is None
    finally:
        let_go(squatter)
