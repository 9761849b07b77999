"""hostkvd refuses secret files other users may read or write.

--auth_token_file, --tier_password_file and --metrics_token_file: a file
others can read (mode & 0004) or write (mode & 0002) stops the daemon at
start (exit 2) with a message naming the flag, the file, its mode in octal
and the chmod that fixes it; group access (0640, 0440: a Kubernetes Secret
with the pod's fsGroup) and 0600 are taken. The mode is the file's that is
read: a symlink (a Secret's ..data link) is judged by its target.
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from conftest import hostkvd_binary, write_secret

FLAGS = ["auth_token_file", "tier_password_file", "metrics_token_file"]


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(prefix="hostkv-secrets-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start(workdir, *flags):
    sock = os.path.join(workdir, "hostkvd.sock")
    return sock, subprocess.Popen(
        [hostkvd_binary(), f"--listen=unix:{sock}", "--memory_reserve=256MiB", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def refused(workdir, *flags):
    """The daemon's exit code and output; it must exit at start."""
    _, daemon = start(workdir, *flags)
    try:
        out, _ = daemon.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.communicate()
        raise AssertionError(f"hostkvd {flags} did not exit at start")
    return daemon.returncode, out


def serves(workdir, *flags):
    """True if the daemon comes up (its session socket exists) with `flags`."""
    sock, daemon = start(workdir, *flags)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and daemon.poll() is None:
            if os.path.exists(sock + ".session"):
                return True
            time.sleep(0.05)
        return False
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.communicate(timeout=15)
        else:
            print(daemon.communicate()[0])


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("mode", [0o644, 0o604, 0o602, 0o666, 0o777])
def test_a_file_others_may_read_or_write_is_refused(workdir, flag, mode):
    path = write_secret(os.path.join(workdir, "secret"), "s3cret\n", mode)
    rc, out = refused(workdir, f"--{flag}={path}")
    assert rc == 2, out
    assert f"--{flag} {path}: mode {mode:04o} lets other users" in out, out
    assert ("read" if mode & 0o004 else "write") in out, out
    assert f"chmod 0600 {path}" in out, out
    assert "s3cret" not in out, out


@pytest.mark.parametrize("flag", FLAGS)
def test_a_world_readable_target_behind_a_symlink_is_refused(workdir, flag):
    target = write_secret(os.path.join(workdir, "target"), "s3cret\n", 0o644)
    link = os.path.join(workdir, "link")
    os.symlink(target, link)
    rc, out = refused(workdir, f"--{flag}={link}")
    assert rc == 2 and "mode 0644" in out, out


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("mode", [0o600, 0o400, 0o640, 0o440])
def test_owner_and_group_modes_are_taken(workdir, flag, mode):
    target = write_secret(os.path.join(workdir, "target"), "s3cret\n", mode)
    link = os.path.join(workdir, "..data-link")  # as a Kubernetes Secret mounts it
    os.symlink(target, link)
    assert serves(workdir, f"--{flag}={link}")


@pytest.mark.parametrize("flag", FLAGS)
def test_an_empty_first_line_or_a_directory_is_refused(workdir, flag):
    empty = write_secret(os.path.join(workdir, "empty"), "\nsecond line\n")
    rc, out = refused(workdir, f"--{flag}={empty}")
    assert rc == 2 and f"--{flag} {empty}: cannot read" in out, out
    rc, out = refused(workdir, f"--{flag}={workdir}")
    assert rc == 2 and f"--{flag} {workdir} is not a regular file" in out, out
