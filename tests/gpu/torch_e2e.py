#!/usr/bin/env python3
"""PyTorch CUDA end to end: hostkvd --cuda=on and two engine processes.

    python3 torch_e2e.py

Environment: HOSTKVD_BINARY names hostkvd; with HOSTKVD_LOADER (and
HOSTKVD_LIBRARY_PATH, default the loader's folder) it runs through that
dynamic loader, as DaemonProcess does with the GPU bundle's. PYTHONPATH
holds the hostkv package with its generated _proto stubs. With
HOSTKV_GPU_TEST_LOGS set the logs are copied there.

Engine A (its own process) exports CUDA KV tensors (K: a tensor per layer;
V: views of one tensor) with hostkv.cuda.export_cuda and registers them
with GpuSignals; on a stream it fills them with random bytes after a delay
(torch.cuda._sleep), marks "KV written" and backs them up with
wait_kv_written = that mark, no host sync in between (a backup that did not
wait would save the zeros that were there); it saves the bytes it expects
and hands the pages over to B. Engine B registers its own tensors (K views,
V separate) filled with a sentinel, loads the pages behind a mark a delayed
side stream writes, and on its compute stream waits for each layer with
GpuSignals.wait_layer before copying the layer's rows out (without the wait
it would copy the sentinel). Then it compares bytes with A's. A third
engine (torch_e2e_sglang.py) drives hostkv.sglang's host-pool classes as
HiCache's controller does, on CUDA device pools; then two vLLM instances
(torch_e2e_vllm.py) store and load blocks through hostkv.vllm.

Prints one summary line. Exit 0 when the bytes match; 1 on a mismatch or
an error (the bundled hostkv package not importing is one); 3 (skipped)
without torch CUDA, grpcio or protobuf; 2 without HOSTKVD_BINARY.
"""
import argparse
import ctypes
import importlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_e2e_engines import run_engine  # noqa: E402

# The whole run, daemon start to the last byte compared (after import torch
# and CUDA's start, which skip_reason pays): three engine processes that each
# import torch and make a CUDA context. $HOSTKV_TORCH_E2E_SECONDS overrides.
DEADLINE_S = float(os.environ.get("HOSTKV_TORCH_E2E_SECONDS", "110"))


_IMPORT_STARTED = time.monotonic()


def skip_reason():
    """Why this machine cannot run the check, or None."""
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        return f"no torch ({e})"
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} has no CUDA (built for CUDA "
                f"{torch.version.cuda}; torch.cuda.is_available() is False)")
    try:
        importlib.import_module("google.protobuf")
        importlib.import_module("grpc")
    except ImportError as e:
        return f"python3 has no grpcio or protobuf ({e})"
    return None


def _die_with_parent():
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Daemon:
    """hostkvd --cuda=on on unix:<workdir>/hostkvd.sock, log in the workdir."""

    def __init__(self, workdir, deadline):
        binary = os.environ["HOSTKVD_BINARY"]
        argv = [binary]
        loader = os.environ.get("HOSTKVD_LOADER")
        if loader:
            libs = os.environ.get("HOSTKVD_LIBRARY_PATH") or os.path.dirname(loader)
            argv = [loader, "--library-path", libs, "--argv0", "hostkvd", binary]
        self.sock = os.path.join(workdir, "hostkvd.sock")
        self.target = "unix:" + self.sock
        self.log_path = os.path.join(workdir, "hostkvd.log")
        argv += [f"--listen={self.target}", "--cuda=on", "--memory_reserve=256MiB",
                 "--log_level=debug"]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=log,
                                            stdin=subprocess.DEVNULL,
                                            preexec_fn=_die_with_parent)
        self._wait_ready(deadline)

    def _wait_ready(self, deadline):
        import hostkv  # pylint: disable=import-outside-toplevel
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"hostkvd exited at start (code {self.process.returncode}):"
                                   f" {self.log_tail()}")
            if os.path.exists(self.sock + ".session"):
                try:
                    hostkv.Client(self.target, "probe", connect_timeout=1).close()
                    return
                except hostkv.errors.Unavailable:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"hostkvd did not come up in time: {self.log_tail()}")

    def log_tail(self, lines=5):
        with open(self.log_path, errors="replace") as f:
            return " | ".join(f.read().splitlines()[-lines:])

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _engine(role, target, workdir, *extra):
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--engine", role, "--target", target,
         "--workdir", workdir, *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _left(deadline):
    return max(1.0, deadline - time.monotonic())


def run_engines(target, workdir, deadline):
    """Starts B, then A with B's session number, then feeds A's hand-over
    to B. Returns B's result line; raises RuntimeError on any failure."""
    b = _engine("b", target, workdir)
    try:
        # B writes nothing more until it has the hand-over, so this readline
        # buffers no more than its first line (communicate reads the fd).
        ready, _, _ = select.select([b.stdout], [], [], _left(deadline))
        first = b.stdout.readline().split() if ready else []
        if len(first) != 2 or first[0] != "session":
            raise RuntimeError(f"engine B did not open a session (exit {b.wait()})")
        a = _engine("a", target, workdir, "--to-session", first[1])
        try:
            handover, _ = a.communicate(timeout=_left(deadline))
        except subprocess.TimeoutExpired:
            a.kill()
            raise RuntimeError("engine A did not finish in time") from None
        if a.returncode != 0:
            raise RuntimeError(f"engine A failed (exit {a.returncode})")
        try:
            result, _ = b.communicate(handover, timeout=_left(deadline))
        except subprocess.TimeoutExpired:
            raise RuntimeError("engine B did not finish in time") from None
        if b.returncode != 0:
            raise RuntimeError(f"engine B failed (exit {b.returncode})")
        return result.strip()
    finally:
        if b.poll() is None:
            b.kill()
            b.wait()


def run_sglang(target, workdir, deadline):
    """The SGLang-class engine (torch_e2e_sglang.py) in its own process."""
    engine = _engine("sglang", target, workdir)
    try:
        out, _ = engine.communicate(timeout=_left(deadline))
    except subprocess.TimeoutExpired:
        engine.kill()
        engine.wait()
        raise RuntimeError("the SGLang-class engine did not finish in time") from None
    if engine.returncode != 0:
        raise RuntimeError(f"the SGLang-class engine failed (exit {engine.returncode})")
    return out.strip().splitlines()[-1]


def run_vllm(target, workdir, deadline):
    """Two vLLM instances (torch_e2e_vllm.py), one process each: A stores
    blocks, then B loads them."""
    line = ""
    for role in ("vllm-a", "vllm-b"):
        engine = _engine(role, target, workdir)
        try:
            out, _ = engine.communicate(timeout=_left(deadline))
        except subprocess.TimeoutExpired:
            engine.kill()
            engine.wait()
            raise RuntimeError(f"the vLLM engine {role} did not finish in time") from None
        if engine.returncode != 0:
            raise RuntimeError(f"the vLLM engine {role} failed (exit {engine.returncode})")
        line = out.strip().splitlines()[-1] if out.strip() else ""
    return line


def launch():
    why = skip_reason()
    if why is not None:
        print(f"torch_e2e: SKIPPED: {why}")
        return 3
    if not os.environ.get("HOSTKVD_BINARY"):
        print("torch_e2e: usage: HOSTKVD_BINARY=hostkvd [HOSTKVD_LOADER=ld.so "
              "HOSTKVD_LIBRARY_PATH=lib] python3 torch_e2e.py")
        return 2
    try:
        importlib.import_module("hostkv")
    except ImportError as e:
        print(f"torch_e2e: FAIL: cannot import hostkv (PYTHONPATH={os.environ.get('PYTHONPATH')}):"
              f" {e}")
        return 1
    started = time.monotonic()
    deadline = started + DEADLINE_S
    workdir = tempfile.mkdtemp(prefix="hostkv-torch-e2e-")
    daemon = None
    times = [("import torch + CUDA check", started - _IMPORT_STARTED)]

    def lap(what, since):
        times.append((what, time.monotonic() - since))
        return time.monotonic()

    try:
        t = time.monotonic()
        daemon = Daemon(workdir, deadline)
        t = lap("hostkvd start", t)
        result = run_engines(daemon.target, workdir, deadline)
        t = lap("engines A and B", t)
        result += "; " + run_sglang(daemon.target, workdir, deadline)
        t = lap("SGLang-class engine", t)
        result += "; " + run_vllm(daemon.target, workdir, deadline)
        lap("vLLM engines", t)
        print(f"torch_e2e: PASS: {result} ({time.monotonic() - started:.1f} s)")
        return 0
    except RuntimeError as e:
        print(f"torch_e2e: FAIL: {e}")
        return 1
    finally:
        print("torch_e2e: time: " + ", ".join(f"{what} {s:.1f} s" for what, s in times)
              + f" (deadline {DEADLINE_S:.0f} s after the CUDA check)")
        if daemon is not None:
            daemon.stop()
        logs = os.environ.get("HOSTKV_GPU_TEST_LOGS")
        if logs and os.path.exists(os.path.join(workdir, "hostkvd.log")):
            os.makedirs(logs, exist_ok=True)
            shutil.copy(os.path.join(workdir, "hostkvd.log"),
                        os.path.join(logs, "torch_e2e-hostkvd.log"))
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["a", "b", "sglang", "vllm-a", "vllm-b"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--to-session", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine == "sglang":
        from torch_e2e_sglang import run  # pylint: disable=import-outside-toplevel
        return run(args.target)
    if args.engine in ("vllm-a", "vllm-b"):
        from torch_e2e_vllm import run as run_vllm_engine  # pylint: disable=import-outside-toplevel
        return run_vllm_engine(args.engine, args.target, args.workdir)
    if args.engine:
        return run_engine(args.engine, args.target, args.workdir, args.to_session)
    return launch()


if __name__ == "__main__":
    sys.exit(main())
