"""The restart soak (deploy/README.md "Restarts and upgrades"): three engine
processes (an SGLang host pool, a publisher, a reader; restart_soak_child.py)
work while hostkvd is SIGKILLed and started again, then replaced with
--takeover, several times in a row. Nothing may reach them as an error,
no byte read back may differ, no acknowledged key may be lost.

SOAK_KILLS and SOAK_TAKEOVERS (default 5 and 2) size it; the counts and the
longest stall each engine saw are printed."""
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import pytest

pytest.importorskip("torch")

from conftest import Daemon  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROLES = ("sglang", "publisher", "reader")


def start_child(role, target, ack_file):
    child = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "restart_soak_child.py"), role, target, ack_file],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE)
    line = child.stdout.readline()
    assert line.strip() == "ready", (role, line)
    return child


def test_three_engines_through_kills_and_takeovers():
    kills = int(os.environ.get("SOAK_KILLS", 5))
    takeovers = int(os.environ.get("SOAK_TAKEOVERS", 2))
    rng = random.Random(11)
    d = Daemon()
    ack_file = tempfile.mktemp(prefix="hostkv-soak-acks-")
    children = {}
    try:
        for role in ROLES:
            children[role] = start_child(role, d.target, ack_file)
        for _ in range(kills):
            time.sleep(rng.uniform(1.0, 2.0))
            d.kill()
            time.sleep(rng.uniform(0.0, 0.5))
            d.restart()
        for _ in range(takeovers):
            time.sleep(rng.uniform(1.0, 2.0))
            old = d.process
            d.process = subprocess.Popen(d._args + ["--takeover"])  # pylint: disable=protected-access
            assert old.wait(timeout=60) == 0, "the daemon taken over drained and exited 0"
            d._wait_ready(False, None)  # pylint: disable=protected-access
        time.sleep(2.0)
        assert d.process.poll() is None
        reports = {}
        for role, child in children.items():
            child.stdin.close()  # ends its work: it checks, reports, exits
        for role, child in children.items():
            out = child.stdout.read()
            child.wait(timeout=180)
            reports[role] = json.loads(out.strip().splitlines()[-1])
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
        d.stop()
        if os.path.exists(ack_file):
            os.unlink(ack_file)
    for role, r in reports.items():
        print(f"soak {role}: {r['rounds']} rounds, longest {r['longest'] * 1e3:.0f} ms, "
              f"skipped {r['skipped']}, unavailable {r['unavailable']}")
    for role, r in reports.items():
        assert r["exceptions"] == [], (role, r["exceptions"])
        assert r["mismatches"] == 0, (role, r)
        assert r["lost"] == 0, (role, r)
        assert r["rounds"] > 20, (role, r)
    cached, stored = reports["reader"]["checked"]
    print(f"soak: {cached} published keys and {stored} stored prompts checked at the end")
    assert cached > 50 and stored > 5, reports["reader"]
