#!/usr/bin/python3
"""vLLM's KV offloading through hostkv.vllm against vLLM's own CPU path.

One hostkvd (CPU backend, a private unix socket, started here) and one
vLLM-shaped instance on it (tests/python/vllm_fixtures.py over the vLLM
stand-in): a worker with FlashAttention KV caches in shared memory, the
scheduler's manager, the spec built per role as vLLM's connector does.
The model: 16 layers, 4 KV heads x 128, bf16, block_size 16: 32 canonical
tensors (K and V of each layer) of 16 KiB pages, 512 KiB per block.

Baseline, measured in the same run on the same tensors: vLLM's CPU
offloading reduced to its copy (worker/cpu_gpu.py moves blocks between a
GPU tensor and a CPU tensor per canonical tensor): per tensor
`dst.index_copy_(0, dst_ids, src.index_select(0, src_ids))` between the
KV caches and a plain CPU tensor of the same rows. A second baseline does
what vLLM's swap_blocks does on a GPU: one copy per (tensor, block) pair,
here `dst[j].copy_(src[i])` (a memcpy each, plus the Python loop).

Rows, for 1, 16 and 256 blocks at random (scattered) GPU block ids:
  store     prepare_store -> transfer_async -> wait -> get_finished (which
            publishes the blocks) -> complete_store, new blocks each time (the pool evicts the
            oldest when full), against the baseline's GPU -> CPU copy;
  load      lookup -> prepare_load -> transfer_async -> wait ->
            complete_load of stored blocks, against the CPU -> GPU copy;
  store_submit / load_submit   transfer_async alone (what vLLM's worker
            thread waits for before it goes on), against the same copies.

Every KV block is stored and loaded once before timing (the daemon's
first touch of a page of the engine's shared memory is a page fault that
a running engine has long paid). Each round times every row once per size, ours and the baseline adjacent;
the ratio is the median over rounds of the round's ours / baseline, with
its interquartile range. Asserts no timing.

  python3 tests/bench/vllm_offload_bench.py [--build_dir=build] [--rounds=N]
"""
import bench_env  # noqa: F401,E402 (first: Debian's python3, client/python, build/ defaults)
import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYTHONHASHSEED", "0")
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
sys.path.insert(0, os.path.join(REPO, "client", "python"))

SIZES = (1, 16, 256)
MODEL = dict(layers=16, heads=4, head_size=128)


def start_daemon(hostkvd, workdir):
    sock = os.path.join(workdir, "hostkvd.sock")
    process = subprocess.Popen([hostkvd, f"--listen=unix:{sock}", "--memory_reserve=256MiB",
                                "--log_level=warn"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not os.path.exists(sock + ".session"):
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit("hostkvd did not start")
        time.sleep(0.05)
    return process, f"unix:{sock}"


def quartiles(values):
    v = sorted(values)
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return q[0], statistics.median(v), q[2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build_dir", default=os.path.join(REPO, "build"))
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    os.environ.setdefault("HOSTKV_PROTO_DIR",
                          os.path.join(args.build_dir, "client", "python", "hostkv_proto"))
    import torch  # pylint: disable=import-outside-toplevel
    import vllm_fixtures as vf  # pylint: disable=import-outside-toplevel

    workdir = tempfile.mkdtemp(prefix="hostkv-vllm-bench-")
    daemon, target = start_daemon(os.path.join(args.build_dir, "server", "hostkvd"), workdir)
    try:
        num_blocks = 2 * max(SIZES) + 64
        block = 2 * MODEL["layers"] * 16 * MODEL["heads"] * MODEL["head_size"] * 2
        inst = vf.Instance(target, seed=1, model="bench/vllm-offload", num_blocks=num_blocks,
                           capacity_bytes=4 * max(SIZES) * block, events=False,
                           dtype=torch.bfloat16, **MODEL)
        worker = inst.workers[0]
        sched = inst.sched
        gpu = [t.tensor for t in vf.drive.canonicalize(inst.caches[0], inst.kcc).tensors]
        cpu = [torch.zeros_like(t) for t in gpu]  # the baseline's CPU pool
        rng = random.Random(7)
        prompt = [0]

        def new_hashes(n):
            prompt[0] += 1
            return vf.prompt_hashes(n, first_token=prompt[0] * 1_000_000)

        def ids(n):
            return rng.sample(range(num_blocks), n)

        def baseline(src, dst, src_ids, dst_ids):
            s, d = torch.tensor(src_ids), torch.tensor(dst_ids)
            t0 = time.perf_counter()
            for a, b in zip(src, dst):
                b.index_copy_(0, d, a.index_select(0, s))
            return time.perf_counter() - t0

        def block_copies(src, dst, src_ids, dst_ids):
            # What swap_blocks does, one memcpy per (tensor, block) pair.
            t0 = time.perf_counter()
            for a, b in zip(src, dst):
                for i, j in zip(src_ids, dst_ids):
                    b[j].copy_(a[i])
            return time.perf_counter() - t0

        def store(n, gpu_ids=None):
            hashes = new_hashes(n)
            gpu_ids = gpu_ids if gpu_ids is not None else ids(n)
            t0 = time.perf_counter()
            out, transfer = sched.prepare_store(hashes, gpu_ids)
            t1 = time.perf_counter()
            job = worker.submit(transfer)
            t2 = time.perf_counter()
            worker.wait([job])  # blocks on the job's signal, then get_finished
            sched.complete_store(out.block_hashes_to_store, True)
            t3 = time.perf_counter()
            assert worker.results[job].success
            return t3 - t0, t2 - t1, hashes

        def load(hashes, gpu_ids=None):
            n = len(hashes)
            gpu_ids = gpu_ids if gpu_ids is not None else ids(n)
            t0 = time.perf_counter()
            hits, transfer = sched.lookup_and_prepare_load(hashes, gpu_ids)
            assert hits == n, (hits, n)
            t1 = time.perf_counter()
            job = worker.submit(transfer)
            t2 = time.perf_counter()
            worker.wait([job])
            sched.complete_load(hashes)
            t3 = time.perf_counter()
            return t3 - t0, t2 - t1

        rows = {}
        # Warm up: every KV block once each way (the daemon's first touch of
        # a page of the engine's shared memory is a page fault), and both
        # copies of the baseline.
        everything = list(range(num_blocks))
        for first in range(0, num_blocks, 128):
            chunk = everything[first:first + 128]
            load(store(len(chunk), chunk)[2], chunk)
        baseline(gpu, cpu, everything, everything)
        baseline(cpu, gpu, everything, everything)
        for _ in range(args.rounds):
            for n in SIZES:
                cpu_ids, gpu_ids = ids(n), ids(n)
                base_store = baseline(gpu, cpu, gpu_ids, cpu_ids)
                copy_store = block_copies(gpu, cpu, gpu_ids, cpu_ids)
                total, submit, hashes = store(n)
                base_load = baseline(cpu, gpu, cpu_ids, gpu_ids)
                copy_load = block_copies(cpu, gpu, cpu_ids, gpu_ids)
                ltotal, lsubmit = load(hashes)
                for key, ours, base, copies in (
                        ("store", total, base_store, copy_store),
                        ("store_submit", submit, base_store, copy_store),
                        ("load", ltotal, base_load, copy_load),
                        ("load_submit", lsubmit, base_load, copy_load)):
                    r = rows.setdefault((key, n), {"ours": [], "base": [], "ratio": [],
                                                   "copies": [], "ratio_copies": []})
                    r["ours"].append(ours)
                    r["base"].append(base)
                    r["ratio"].append(ours / base)
                    r["copies"].append(copies)
                    r["ratio_copies"].append(ours / copies)
        print(f"vLLM offload through hostkv.vllm vs index_copy (vLLM's CPU path), "
              f"{args.rounds} rounds, {block // 1024} KiB per block, {os.cpu_count()} CPUs\n")
        print("| row | blocks | MiB | hostkv p50 ms | index_copy p50 ms | hostkv / index_copy "
              "(IQR) | block copy_ p50 ms | hostkv / block copy_ (IQR) |")
        print("|---|--:|--:|--:|--:|--:|--:|--:|")
        for (key, n), r in rows.items():
            q1, med, q3 = quartiles(r["ratio"])
            c1, cmed, c3 = quartiles(r["ratio_copies"])
            print(f"| {key} | {n} | {n * block / 2**20:.1f} | "
                  f"{statistics.median(r['ours']) * 1e3:.3f} | "
                  f"{statistics.median(r['base']) * 1e3:.3f} | {med:.2f} ({q1:.2f}-{q3:.2f}) | "
                  f"{statistics.median(r['copies']) * 1e3:.3f} | "
                  f"{cmed:.2f} ({c1:.2f}-{c3:.2f}) |")
        inst.close()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
