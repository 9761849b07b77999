"""Many users on one node, round 3 (issue 38): uids that pool their per-uid
shares cannot run the daemon out of descriptors, nor keep a new user out.

Eight uids each hold as many sessions (a session-socket connection each)
and raw gRPC connections as the daemon lets them, against a hostkvd under
RLIMIT_NOFILE 4096. Their per-uid bounds add up to the whole limit
(8 x (256 sessions + 256 gRPC connections)); the daemon's shares of it
(server/operations/descriptor_shares.h) stop them short, keep the last
eighth of each for uids holding few, and another user's new client opens
its session, its gRPC connection and its ring and runs calls. Before the
shares the daemon ran out of descriptors and the new client was refused.
"""
import json
import os
import subprocess
import sys

import pytest

import hostkv
from conftest import hostkvd_binary
from test_tenants_round3_descriptors import RAW, let_go, read_json, shared_daemon

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run the attackers as other uids")

UIDS = [61011, 61012, 61013, 61014, 61015, 61016, 61017, 61018]
LIMIT = 4096

# Opens sessions over the session socket until one is refused, then raw
# gRPC connections (up to 300) on the daemon's socket; counts those the
# daemon did not close at once. Prints what it holds; holds it until its
# stdin closes.
HOLD = RAW + r"""
session_path, grpc_path = sys.argv[1], sys.argv[2]
sessions, refusal = [], None
while len(sessions) < 400:
    try:
        s, r = session(session_path)
    except OSError as e:
        refusal = str(e)
        break
    if r is None or r[0] != 0:
        refusal = r[2] if r else "closed"
        s.close()
        break
    sessions.append(s)
grpc = []
for _ in range(300):
    g = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        g.connect(grpc_path)
    except OSError:
        g.close()
        break
    grpc.append(g)
time.sleep(1.0)
held = []
for g in grpc:
    g.setblocking(False)
    try:
        open_ = g.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        open_ = True
    except OSError:
        open_ = False
    if open_:
        held.append(g)
    else:
        g.close()
print(json.dumps({"sessions": len(sessions), "grpc": len(held), "refusal": refusal}),
      flush=True)
sys.stdin.read()
"""


def as_uid(uid, script, *args):
    return subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                             sys.executable, "-c", script, *map(str, args)],
                            cwd="/", text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture
def descriptor_limit_4096(tmp_path, monkeypatch):
    wrapper = tmp_path / "hostkvd-4096"
    wrapper.write_text(f'#!/bin/sh\nexec prlimit --nofile={LIMIT}:{LIMIT} '
                       f'{hostkvd_binary()} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("HOSTKVD", str(wrapper))


def test_uids_pooling_their_shares_leave_room_for_a_new_user(descriptor_limit_4096):
    daemon = shared_daemon()
    holders = []
    try:
        got = []
        for uid in UIDS:  # one after another: the first ones take the most
            holder = as_uid(uid, HOLD, daemon.sock + ".session", daemon.sock)
            holders.append(holder)
            got.append(read_json(holder))
        # Another user's new client is served beside them: its session, its
        # gRPC connection, its ring, its calls.
        with hostkv.Client(daemon.target, "newcomer", connect_timeout=5) as c:
            assert c.uses_command_ring
            spec = hostkv.mha_pool_spec("round3-shares", num_layers=2, num_kv_heads=2,
                                        head_dim=8, page_size=4, capacity_tokens=256)
            c.create_pool(spec, delete_with_session=True)
            pages = c.alloc("round3-shares", 16)
            assert c.free("round3-shares", pages) == 4
            assert c.list_pools()
        sessions = sum(g["sessions"] for g in got)
        grpc = sum(g["grpc"] for g in got)
        # Session-socket connections: a quarter of 4096 (1024); 256 sessions
        # per uid; past 896 only uids holding fewer than 16 (1024 / 64).
        assert [g["sessions"] for g in got] == [256, 256, 256, 128] + [16] * 4, got
        # Refused at accept: the reply names why, unless the daemon's close
        # (the record it did not read) reset the connection first.
        assert ("kept for users holding few" in got[3]["refusal"]
                or "reset by peer" in got[3]["refusal"]), got
        # gRPC connections: a quarter too; 256 per uid.
        assert [g["grpc"] for g in got] == [256, 256, 256, 128] + [16] * 4, got
        assert sessions <= 1024 and grpc <= 1024, got
        assert daemon.process.poll() is None
    finally:
        for holder in holders:
            let_go(holder)
        daemon.stop()
