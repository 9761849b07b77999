"""Fixtures: a real hostkvd on a private socket, and clients of it.

Environment (set by tests/python/CMakeLists.txt):
  HOSTKVD           the hostkvd binary
  HOSTKV_PROTO_DIR  the generated stubs (hostkv._proto looks there too)
  PYTHONPATH        includes client/python
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

import hostkv


def write_secret(path, text, mode=0o600):
    """Writes a token or password file as hostkvd takes it: others may
    neither read nor write it (0600 by default, whatever the umask)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)  # the umask, or an existing file's mode, may differ
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def hostkvd_binary():
    path = os.environ.get("HOSTKVD")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("HOSTKVD does not name the hostkvd binary")
    return path


class Daemon:
    """hostkvd on unix:<tmp>/hostkvd.sock (or tcp:PORT), stopped by stop()."""

    def __init__(self, *flags, tcp=False, token=None):
        self.workdir = tempfile.mkdtemp(prefix="hostkv-pytest-")
        args = [hostkvd_binary(), "--memory_reserve=256MiB", *flags]
        if tcp:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            args.append(f"--listen=tcp:{port}")
            self.target = f"127.0.0.1:{port}"
        else:
            self.sock = os.path.join(self.workdir, "hostkvd.sock")
            args.append(f"--listen=unix:{self.sock}")
            self.target = f"unix:{self.sock}"
        if token:
            token_file = write_secret(os.path.join(self.workdir, "token"), token + "\n")
            args.append(f"--auth_token_file={token_file}")
        self._args, self._tcp, self._token = args, tcp, token
        self.process = subprocess.Popen(args)
        self._wait_ready(tcp, token)

    def kill(self):
        """SIGKILL, as an OOM kill or a crash: nothing is cleaned up."""
        self.process.kill()
        self.process.wait()

    def restart(self, *flags):
        """A new hostkvd with the same flags (and `flags`) on the same socket:
        it adopts the state the previous one left, unless a flag is
        --discard_state."""
        assert self.process.poll() is not None, "the daemon still runs"
        self.process = subprocess.Popen(self._args + list(flags))
        self._wait_ready(self._tcp, self._token)

    def _wait_ready(self, tcp, token):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "hostkvd exited at start"
            ready = (not tcp and os.path.exists(self.sock + ".session")) or tcp
            if ready:
                try:
                    hostkv.Client(self.target, "probe", auth_token=token,
                                  connect_timeout=1).close()
                    return
                except hostkv.errors.Unavailable:
                    pass
            time.sleep(0.05)
        raise AssertionError("hostkvd did not come up")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon():
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture
def client(daemon):
    with hostkv.Client(daemon.target, "pytest") as c:
        yield c
