"""Many users on one node, round 3 (issue 38): the gRPC socket against a user
who holds connections, the attacker running as another uid.

- One uid holds at most --max_grpc_connections_per_uid connections to the
  gRPC socket; its next ones are closed at once, and another user's client
  is served meanwhile.
- A daemon run out of file descriptors by held connections serves again as
  soon as they are let go. Before, gRPC's own listener stopped accepting for
  good at its first EMFILE: every new client got UNAVAILABLE until a
  restart.
"""
import json
import os

import pytest

import hostkv
from conftest import hostkvd_binary
from test_tenants_round3_descriptors import (OTHER_UID, a_bystander_is_served, attacker,
                                             let_go, open_descriptors, read_json,
                                             shared_daemon, wait_until)

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run the attacker as another uid")

# Opens argv[2] connections to the gRPC socket argv[1] and holds them without
# a word of HTTP/2; prints how many the daemon closed, then waits for stdin.
HOLD = r"""
import json, os, resource, select, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    s.setblocking(False)
    held.append(s)
time.sleep(2)
def closed(s):
    try:
        while True:
            if s.recv(65536) == b"":
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True
print(json.dumps({"connected": len(held), "closed": sum(map(closed, held))}),
      flush=True)
sys.stdin.read()
"""


def test_one_uid_holds_at_most_its_share_of_grpc_connections():
    daemon = shared_daemon("--max_grpc_connections_per_uid=32")
    try:
        pid = daemon.process.pid
        before = open_descriptors(pid)
        hold = attacker(HOLD, daemon.sock, 200)
        try:
            result = read_json(hold)
            assert result == {"connected": 200, "closed": 168}, result
            assert open_descriptors(pid) - before < 32 + 16, (before, open_descriptors(pid))
            a_bystander_is_served(daemon)
        finally:
            let_go(hold)
        # Its connections gone, the uid has its whole share again.
        again = attacker(HOLD, daemon.sock, 32)
        try:
            assert read_json(again) == {"connected": 32, "closed": 0}
        finally:
            let_go(again)
    finally:
        daemon.stop()


@pytest.fixture
def tiny_descriptor_limit(tmp_path, monkeypatch):
    """hostkvd under RLIMIT_NOFILE 256."""
    wrapper = tmp_path / "hostkvd-256"
    wrapper.write_text(f'#!/bin/sh\nexec prlimit --nofile=256:256 {hostkvd_binary()} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("HOSTKVD", str(wrapper))


def test_a_daemon_out_of_descriptors_serves_again_once_they_are_free(tiny_descriptor_limit):
    # The uid's share (256) is above what the daemon can open at all: its
    # connections take every free descriptor.
    daemon = shared_daemon()
    try:
        hold = attacker(HOLD, daemon.sock, 400)
        try:
            result = read_json(hold)
            # Past the last descriptor, connections are accepted and closed
            # at once rather than left waiting in the backlog.
            assert result["connected"] == 400 and result["closed"] > 100, result
        finally:
            let_go(hold)
        assert wait_until(lambda: open_descriptors(daemon.process.pid) < 128)

        def served():
            try:
                a_bystander_is_served(daemon)
                return True
            except hostkv.HostKVError:
                return False
        assert wait_until(served, seconds=15)
        assert daemon.process.poll() is None
    finally:
        daemon.stop()
