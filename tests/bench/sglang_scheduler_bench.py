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

The adapter part (--part=adapter) times the remote pool's own Python work
per alloc, free, backup_from_device_all_layer and load_to_device_per_layer
(layer 0: the call that submits) at 1, 16 and 256 pages (page size 16), the
implementation in the tree ("new") against a copy of the one before it kept
in this file ("old": OLD_INDICES, OldHostSlots, old_runs), alternating in
one run: first with the client's RPCs answered at once (no gRPC: the
index handling, slot bookkeeping and submission only), then whole calls
against hostkvd (a small MLA geometry, 32 + 32 bf16, one layer, so the
copies are small). Two shapes: "one run" (alloc hands out one run of pages,
the device slots are one run) and "scattered" (every other host page, the
device pages shuffled, as a paged device allocator hands them out).

  python3 tests/bench/sglang_scheduler_bench.py [--build_dir=build]
      [--part=all|scheduler|adapter] [--rounds=N] [--pages=256] [--layers=61]
      [--adapter_pages=1,16,256] [--adapter_calls=400] [--json=FILE]
Asserts no timing; exits non-zero only if a copy's bytes are wrong, or
if the old and new adapter send different runs.
"""
import bench_env  # noqa: F401,E402 (first: Debian's python3, client/python, build/ defaults)
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types

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


def run(args, target):
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
    return samples


# -- the adapter's own Python work: the implementation before this one ------
# A copy of hostkv.sglang's index handling and slot bookkeeping as they were
# before the vectorised rewrite (indices.py, host_slots.py, the pool's
# _runs), kept as the baseline measured in the same run.


def _old_torch():
    import torch  # pylint: disable=import-outside-toplevel
    return torch


def _old_as_index_tensor(indices, what):
    from hostkv import errors  # pylint: disable=import-outside-toplevel
    torch = _old_torch()
    if not isinstance(indices, torch.Tensor):
        indices = torch.as_tensor(indices, dtype=torch.int64)
    if indices.dim() != 1:
        raise errors.InvalidArgument(f"{what}: a 1-D index tensor, not {indices.dim()}-D")
    if indices.dtype not in (torch.int64, torch.int32):
        raise errors.InvalidArgument(f"{what}: integer indices, not {indices.dtype}")
    return indices.to(device="cpu", dtype=torch.int64)


def _old_check_within(indices, limit, what, whose):
    from hostkv import errors  # pylint: disable=import-outside-toplevel
    low, high = int(indices.min()), int(indices.max())
    if low < 0 or high >= limit:
        raise errors.InvalidArgument(
            f"{what} {low if low < 0 else high} is outside {whose} {limit} slots")


def _old_runs_of(values):
    torch = _old_torch()
    n = values.numel()
    if n == 0:
        return []
    starts = torch.ones(n, dtype=torch.bool)
    starts[1:] = values[1:] != values[:-1] + 1
    first_at = torch.nonzero(starts).flatten()
    ends = torch.cat([first_at[1:], torch.tensor([n])])
    return list(zip(values[first_at].tolist(), (ends - first_at).tolist()))


def _old_pages_of(indices, page_size, size, what="host_indices"):
    from hostkv import errors  # pylint: disable=import-outside-toplevel
    torch = _old_torch()
    indices = _old_as_index_tensor(indices, what)
    n = indices.numel()
    if n % page_size != 0:
        raise errors.InvalidArgument(
            f"{what}: {n} indices are not whole pages of {page_size} tokens")
    if n == 0:
        return indices
    _old_check_within(indices, size, f"{what}: index", "the pool's")
    rows = indices.view(-1, page_size)
    pages = torch.div(rows[:, 0], page_size, rounding_mode="floor")
    expected = pages.unsqueeze(1) * page_size + torch.arange(page_size)
    if not torch.equal(rows, expected):
        raise errors.InvalidArgument(
            f"{what}: indices must cover whole pages in order (page-aligned runs "
            f"of {page_size})")
    return pages


def _old_page_runs(indices, page_size, size, what="host_indices"):
    return _old_runs_of(_old_pages_of(indices, page_size, size, what))


def _old_slot_runs(indices, slots, what="device_indices"):
    indices = _old_as_index_tensor(indices, what)
    if indices.numel() > 0:
        _old_check_within(indices, slots, f"{what}: slot", "the device pool's")
    return _old_runs_of(indices)


def _old_token_indices(runs, page_size):
    torch = _old_torch()
    if not runs:
        return torch.empty(0, dtype=torch.int64)
    return torch.cat([torch.arange(first * page_size, (first + count) * page_size,
                                   dtype=torch.int64) for first, count in runs])


OLD_INDICES = types.SimpleNamespace(
    as_index_tensor=_old_as_index_tensor, runs_of=_old_runs_of, pages_of=_old_pages_of,
    page_runs=_old_page_runs, slot_runs=_old_slot_runs, token_indices=_old_token_indices)


def old_runs(self, host_indices, device_indices):
    """RemoteHostKVCache._runs before: two conversions, then sums over the runs."""
    from hostkv import errors  # pylint: disable=import-outside-toplevel
    host_runs = _old_page_runs(host_indices.get(), self.page_size, self.size)
    device_runs = _old_slot_runs(device_indices.get(), self._device_slots)
    host_tokens = sum(n for _, n in host_runs) * self.page_size
    device_tokens = sum(n for _, n in device_runs)
    if host_tokens != device_tokens:
        raise errors.InvalidArgument(
            f"{host_tokens} host indices but {device_tokens} device indices")
    return host_runs, device_runs


class OldHostSlots:
    """host_slots.HostSlots before (torch operations throughout)."""

    def __init__(self, page_num, page_size):
        torch = _old_torch()
        self.page_num = page_num
        self.page_size = page_size
        self.size = page_num * page_size
        self.used = torch.zeros(self.size, dtype=torch.bool)
        self.held = torch.zeros(page_num, dtype=torch.bool)
        self.held_pages = 0

    def free_pages(self):
        return self.page_num - self.held_pages

    def held_page_numbers(self):
        return _old_torch().nonzero(self.held).flatten()

    def take(self, runs):
        for first, count in runs:
            self.held[first:first + count] = True
            self.used[first * self.page_size:(first + count) * self.page_size] = True
            self.held_pages += count

    def reset(self):
        self.used.zero_()
        self.held.zero_()
        self.held_pages = 0

    def pages_freed_by(self, indices):
        torch = _old_torch()
        if indices.numel() == 0:
            return indices
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= self.size:
            raise IndexError(
                f"free: slot {low if low < 0 else high} is outside the host pool's "
                f"{self.size} slots")
        unique = torch.unique(indices)
        if unique.numel() != indices.numel():
            raise AssertionError(
                "Double-free detected: a slot appears more than once in one free.")
        if not bool(self.used[indices].all()):
            bad = indices[~self.used[indices]][:16].tolist()
            raise AssertionError(
                f"Double-free detected: slots not currently allocated: {bad}.")
        pages = torch.unique(torch.div(unique, self.page_size, rounding_mode="floor"))
        rows = pages.unsqueeze(1) * self.page_size + torch.arange(self.page_size)
        still_used = self.used[rows].clone()
        still_used[torch.isin(rows, unique)] = False
        return pages[~still_used.any(dim=1)]

    def release(self, indices, pages):
        self.used[indices] = False
        if pages.numel():
            self.held[pages] = False
            self.held_pages -= pages.numel()


class NoRpc:
    """A pool's client whose RPCs on the adapter's path answer at once
    (alloc hands out `alloc_runs`): what a call then costs is the
    adapter's own Python work. Everything else goes to the real client.
    `sent` keeps the runs of the last free and transfer."""

    def __init__(self, real, operation):
        self._real = real
        self._operation = operation
        self.alloc_runs = []
        self.sent = {}

    def __getattr__(self, name):
        return getattr(self._real, name)

    def alloc(self, pool, num_tokens, wait=True):
        del pool, num_tokens, wait
        return self.alloc_runs

    def free(self, pool, pages):
        del pool
        self.sent["free"] = pages
        return 0

    def load(self, pool, import_id, host_pages, device_slots, **options):
        del pool, import_id, options
        self.sent["transfer"] = (host_pages, device_slots)
        return self._operation

    backup = load

    def wait(self, op, timeout=60.0):
        del op, timeout

    def wait_layer(self, op, layer, timeout=60.0):
        del op, layer, timeout


class Implementation:
    """Puts the old or the tree's index handling under a pool while active."""

    def __init__(self, pool, old):
        from hostkv.sglang import remote_pool  # pylint: disable=import-outside-toplevel
        self._module = remote_pool
        self._tree_idx = remote_pool.idx
        self.pool, self.old = pool, old
        if old:
            # pylint: disable=protected-access
            pool._slots = OldHostSlots(pool.page_num, pool.page_size)
            pool._runs = types.MethodType(old_runs, pool)

    def __enter__(self):
        self._module.idx = OLD_INDICES if self.old else self._tree_idx
        return self.pool

    def __exit__(self, *exc):
        self._module.idx = self._tree_idx


def adapter_costs(args, target):
    """{(stage, pages, shape, call, impl): [microseconds, ...]}."""
    import torch  # pylint: disable=import-outside-toplevel
    from hostkv.client import Operation  # pylint: disable=import-outside-toplevel
    from hostkv.sglang import RemoteMLATokenToKVPoolHost  # pylint: disable=import-outside-toplevel
    from hostkv.sglang.cpu_device_pool import CpuMLATokenToKVPool  # pylint: disable=import-outside-toplevel

    ps = 16
    sizes = [int(p) for p in args.adapter_pages.split(",")]
    most = max(sizes)
    device = CpuMLATokenToKVPool(2 * most * ps, ps, 32, 32, 1, torch.bfloat16)
    rng = random.Random(26)
    samples = {}
    for stage in ("no_rpc", "hostkvd"):
        impls = {}
        for impl in ("old", "new"):
            pool = RemoteMLATokenToKVPoolHost(device, 2.0, 0, ps, "layer_first",
                                              host_page_num=2 * most + 1, target=target,
                                              async_submit=False)
            if stage == "no_rpc":
                stub = NoRpc(pool.client, Operation(1, 0, 0, 1, 0))
                pool.client = stub
                pool._sync._client = stub  # pylint: disable=protected-access
            impls[impl] = Implementation(pool, impl == "old")
        for pages in sizes:
            tokens = pages * ps
            for shape in ("one run", "scattered"):
                if shape == "one run":
                    runs = [(1, pages)]
                    dev = torch.arange(ps, ps + tokens)
                else:
                    runs = [(1 + 2 * i, 1) for i in range(pages)]
                    order = rng.sample(range(1, 2 * most), pages)
                    dev = (torch.tensor(order).unsqueeze(1) * ps + torch.arange(ps)).flatten()
                if stage == "hostkvd" and shape == "scattered":
                    continue  # hostkvd decides where its pages are; one shape there
                calls = args.adapter_calls
                if stage == "hostkvd":
                    calls = max(20, calls // 8)
                for _ in range(0, calls, 10):
                    for impl, active in impls.items():  # alternating batches of 10
                        with active as pool:
                            if stage == "no_rpc":
                                pool.client.alloc_runs = runs
                            for _ in range(10):
                                key = (stage, pages, shape)
                                h = timed(samples, key + ("alloc", impl), pool.alloc, tokens)
                                timed(samples, key + ("backup", impl),
                                      pool.backup_from_device_all_layer, device, h, dev,
                                      "kernel")
                                timed(samples, key + ("load layer 0", impl),
                                      pool.load_to_device_per_layer, device, h, dev, 0,
                                      "kernel")
                                timed(samples, key + ("free", impl), pool.free, h)
                                if pool.available_size() != pool.size:
                                    raise SystemExit(f"{impl}: free left slots in use")
                if stage == "no_rpc":
                    old, new = (impls[i].pool.client.sent for i in ("old", "new"))
                    if old != new:
                        raise SystemExit(f"{pages} pages, {shape}: old and new sent "
                                         f"different runs: {old} != {new}")
        for active in impls.values():
            active.pool.close()
    return samples


def print_adapter(samples, json_out):
    print()
    print("| the adapter's own work (page 16, MLA) | pages | shape | old p50 us "
          "| new p50 us | old / new |")
    print("|---|--:|---|--:|--:|--:|")
    keys = sorted({k[:4] for k in samples},
                  key=lambda k: (k[0] != "no_rpc", ["alloc", "free", "backup",
                                                    "load layer 0"].index(k[3]), k[1], k[2]))
    for stage, pages, shape, call in keys:
        old = statistics.median(samples[(stage, pages, shape, call, "old")])
        new = statistics.median(samples[(stage, pages, shape, call, "new")])
        what = f"{call}, no RPC" if stage == "no_rpc" else f"{call}, whole call (hostkvd)"
        print(f"| {what} | {pages} | {shape} | {old:.1f} | {new:.1f} | {old / new:.1f}x |")
        json_out[f"adapter {stage} {call} {pages} pages {shape}"] = {
            "old_p50_us": old, "new_p50_us": new,
            "n": len(samples[(stage, pages, shape, call, "new")])}


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def print_scheduler(args, samples, json_out):
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
        json_out[key] = {"p50_us": p50, "p99_us": pct(samples[key], 0.99),
                         "n": len(samples[key])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build_dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--part", choices=("all", "scheduler", "adapter"), default="all")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pages", type=int, default=256)
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--adapter_pages", default="1,16,256")
    ap.add_argument("--adapter_calls", type=int, default=400)
    ap.add_argument("--json")
    args = ap.parse_args()
    json_out = {}
    proc, workdir, target = start_daemon(args.build_dir)
    try:
        if args.part in ("all", "scheduler"):
            print_scheduler(args, run(args, target), json_out)
        if args.part in ("all", "adapter"):
            print_adapter(adapter_costs(args, target), json_out)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(json_out, f, indent=1)


if __name__ == "__main__":
    main()
