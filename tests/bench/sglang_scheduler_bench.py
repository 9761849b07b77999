#!/usr/bin/python3
"""How long SGLang's scheduler thread spends in a host pool's transfer
calls: hostkv.sglang's remote pool against SGLang's in-process pool, one
run, CPU backend.

SGLang's controller (cache_controller.py at 001067ff, l2_transfer.py at
67e863cd) calls, on its scheduler thread, backup_from_device_all_layer
once per write and load_to_device_per_layer once per layer of a load.
Geometry: DeepSeek-V3's MLA (61 layers, kv_lora_rank 512 + rope 64, bf16),
page_size 16, 256 pages per transfer (4,096 tokens, 4.7 MB a layer).

Rows (p50 / p99 of the time inside each call, microseconds):
  inprocess        SGLang's in-process pool on the CPU: the copy itself,
                   inline (torch index copies, what its kernels do on a GPU)
  hostkv_inline    hostkv on the CPU backend as shipped: the RPC inline,
                   each per-layer call waiting for its layer on the host
  hostkv_async     hostkv's CUDA-path submission, run on the CPU: the
                   RPC on the pool's submitter thread, and the waits not on
                   the calling thread (on CUDA they are cuStreamWaitValue64
                   on the engine's stream, a few microseconds each, not
                   counted here); the benchmark waits for the copies after
                   the calls, as a GPU stream would
  bare_rpc         one bare Python gRPC call (GetPool), for scale

  python3 tests/bench/sglang_scheduler_bench.py [--build_dir=build]
      [--rounds=N] [--pages=256] [--layers=61] [--json=FILE]
Asserts no timing; exits non-zero only if a copy's bytes are wrong.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "client", "python"))


def start_daemon(build_dir):
    workdir = tempfile.mkdtemp(prefix="hostkv-sched-bench-")
    sock = os.path.join(workdir, "hostkvd.sock")
    proc = subprocess.Popen([os.path.join(build_dir, "server", "hostkvd"),
                             f"--listen=unix:{sock}", "--memory_reserve=256MiB",
                             "--log_level=warn"])
    deadline = time.monotonic() + 20
    while not os.path.exists(sock + ".session"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("hostkvd did not start")
        time.sleep(0.05)
    return proc, workdir, f"unix:{sock}"


class DeferredWaits:
    """The CUDA path's shape on the CPU: waits are recorded, not made on
    the calling thread; finish() makes them (the GPU stream's part)."""

    asynchronous = True

    def __init__(self, inner):
        self._inner = inner
        self.pending = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def wait_layer(self, pending, layer):
        self.pending.append((pending, layer))

    def wait_all(self, pending):
        self.pending.append((pending, pending.layer_begin + pending.num_layers - 1))

    def finish(self):
        for pending, layer in self.pending:
            self._inner.wait_layer(pending, layer)
        self.pending.clear()


class InProcess:
    """SGLang's in-process MLA host pool on the CPU, layer_first: the
    copies of its kernels as torch index copies (the CPU reference)."""

    def __init__(self, torch, layers, size, dim, dtype):
        self.buf = torch.zeros((layers, size, 1, dim), dtype=dtype)

    def backup(self, device, host_indices, device_indices):
        for layer, t in enumerate(device.kv_buffer):
            self.buf[layer].index_copy_(0, host_indices, t.index_select(0, device_indices))

    def load_layer(self, device, host_indices, device_indices, layer):
        device.kv_buffer[layer].index_copy_(
            0, device_indices, self.buf[layer].index_select(0, host_indices))


def timed(samples, key, fn, *args, **kwargs):
    start = time.perf_counter_ns()
    result = fn(*args, **kwargs)
    samples.setdefault(key, []).append((time.perf_counter_ns() - start) / 1e3)
    return result


def run(args):
    import torch  # pylint: disable=import-outside-toplevel
    from hostkv.sglang import RemoteMLATokenToKVPoolHost  # pylint: disable=import-outside-toplevel
    from hostkv.sglang.cpu_device_pool import CpuMLATokenToKVPool  # pylint: disable=import-outside-toplevel

    ps, pages, layers = 16, args.pages, args.layers
    tokens = pages * ps
    device = CpuMLATokenToKVPool(tokens, ps, 512, 64, layers, torch.bfloat16)
    for t in device.kv_buffer:
        t.copy_(torch.randn(t.shape).to(torch.bfloat16))
    slots = torch.arange(tokens)
    samples = {}
    proc, workdir, target = start_daemon(args.build_dir)
    try:
        pools = {mode: RemoteMLATokenToKVPoolHost(device, 2.0, 0, ps, "layer_first",
                                                  target=target,
                                                  async_submit=(mode == "hostkv_async"))
                 for mode in ("hostkv_inline", "hostkv_async")}
        deferred = DeferredWaits(pools["hostkv_async"]._sync)  # pylint: disable=protected-access
        pools["hostkv_async"]._sync = deferred  # pylint: disable=protected-access
        inproc = InProcess(torch, layers, pools["hostkv_inline"].size, 576, torch.bfloat16)
        host_idx = {m: p.alloc(tokens) for m, p in pools.items()}
        want = [t.clone() for t in device.kv_buffer]
        for r in range(args.rounds):
            for mode in ("inprocess", "hostkv_inline", "hostkv_async"):
                if mode == "inprocess":
                    h = torch.arange(tokens)
                    timed(samples, "inprocess backup", inproc.backup, device, h, slots)
                    for layer in range(layers):
                        timed(samples, f"inprocess load layer {'0' if layer == 0 else '>0'}",
                              inproc.load_layer, device, h, slots, layer)
                    continue
                pool, h = pools[mode], host_idx[mode]
                timed(samples, f"{mode} backup", pool.backup_from_device_all_layer,
                      device, h, slots, "kernel")
                if mode == "hostkv_async":
                    deferred.finish()
                for t in device.kv_buffer:
                    t.zero_()
                for layer in range(layers):
                    timed(samples, f"{mode} load layer {'0' if layer == 0 else '>0'}",
                          pool.load_to_device_per_layer, device, h, slots, layer, "kernel",
                          is_draft=False)
                if mode == "hostkv_async":
                    deferred.finish()
                if not all(torch.equal(a[:tokens], b[:tokens])
                           for a, b in zip(device.kv_buffer, want)):
                    raise SystemExit(f"{mode}: loaded bytes differ (round {r})")
            c = pools["hostkv_inline"].client
            for _ in range(20):
                timed(samples, "bare_rpc GetPool", c.get_pool, pools["hostkv_inline"].pool_name)
        for p in pools.values():
            p.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    return samples


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build_dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pages", type=int, default=256)
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--json")
    args = ap.parse_args()
    samples = run(args)
    base = {what: statistics.median(samples[f"inprocess {what}"])
            for what in ("backup", "load layer 0", "load layer >0")}
    print(f"| call ({args.pages} pages x {args.layers} layers, MLA 576 bf16, page 16) "
          "| p50 us | p99 us | p50 / in-process |")
    print("|---|--:|--:|--:|")
    for key in sorted(samples):
        what = key.split(" ", 1)[1]
        p50 = statistics.median(samples[key])
        ratio = f"{p50 / base[what]:.3f}x" if what in base else ""
        print(f"| {key} | {p50:.1f} | {pct(samples[key], 0.99):.1f} | {ratio} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({k: {"p50_us": statistics.median(v), "p99_us": pct(v, 0.99),
                           "n": len(v)} for k, v in samples.items()}, f, indent=1)


if __name__ == "__main__":
    main()
