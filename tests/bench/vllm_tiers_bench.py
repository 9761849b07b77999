#!/usr/bin/python3
"""A warm hit of N KV blocks in a SECOND vLLM instance of the same model:
hostkv beside a model of vLLM's own file tier and a bare memcpy, in one run
on the CPU backend; and the host bytes 4 such instances hold.

One hostkvd (CPU backend, a private unix socket, started here) and two
vLLM v0.26+ instances in miniature (tests/vllm/engine.py over the vLLM
stand-in: the offloading connector's scheduler and one worker per rank, KV
caches in shared memory) of one model: full attention, 8 KV heads x 128
(split over --tp ranks), fp16, block size 16, --layers layers. Instance A
runs --blocks / --request_blocks prompts of --request_blocks full blocks
each and stores their blocks through hostkvd; instance B is built on the
same daemon and model (so it shares A's pool and namespaces). Each
repeat, in this order (all three see the same noise):

  memcpy    the floor: per rank and layer, torch copy_ of the same bytes
            from one host tensor (layer-major, pre-faulted) into B's KV
            tensors, at the GPU block ids B's loads used, one copy_ per
            (layer, run of consecutive block ids).
  fs tier   a MODEL of vLLM's TieringOffloadingSpec with an `fs` tier on
            /dev/shm, not vLLM's code: A wrote one file per (offload key,
            rank) under a temp dir in /dev/shm holding every layer of that
            GPU block (a file-per-chunk store, blocks_per_chunk 1; untimed,
            once). B reads each file with readinto() straight into its own
            CPU tier (a pre-faulted uint8 host tensor, the instance's
            private CPU tier), then copies from there into its KV tensors
            exactly as `memcpy` does (the CPU -> GPU copy's stand-in).
            Timed: read, copy, and both. Ranks run in parallel threads.
  hostkv    B.sched.reset_cache() (B forgets the references its scheduler
            held from the previous repeat, so every key is asked of the
            daemon again, as in a fresh instance), then B.run() of the same
            prompts (new request ids). Timed: run() until every request's
            KV is usable (the engine step that hands the last request's
            loaded blocks to the forward pass), the whole run() (and the
            finishing step), and the load jobs alone, from the first
            submit_load to the last job reported done by B's workers (one
            job per request: Lookup(acquire), Load, wait, Release). A key
            the scheduler holds no reference on answers RETRY at its first
            lookup (the scheduler's agent thread asks the daemon), so the
            run has at least one deferred step, and the miniature engine
            sleeps 2 ms after a step in which nothing could be scheduled.

Every request hits all its blocks (the prompts are whole blocks). The
engine's test-only work is switched off in timed runs: the scribble of
fresh blocks (as engine.py writes it, `t[ids].fill_()` fills a gathered
copy, so it costs a gather of every fresh block and changes nothing) and
the byte-for-byte check of loaded blocks. The warm-up keeps both: B's
first run checks every loaded byte against what A computed, and the fs
model's warm-up copy is checked against A's KV. KV events are off (no
confirm Lookups, no ListEvictions polling thread). All copies are
single-threaded (torch.set_num_threads(1); hostkvd's --copy_threads default
is one on 2 CPUs); with --tp > 1 the memcpy and fs ranks run in parallel
threads, the daemon still copies on its one thread. Warm-up before timing:
one B run with checks and one without (every KV block B uses faulted in by
the daemon), one fs read and copy, one memcpy. Ratios are median / median
of the memcpy row.

What this does not show: vLLM's real fs tier (its I/O threads, staging
buffers, file naming and atomic writes are not modelled; this is its best
case: one read() per file from tmpfs, no metadata beyond open/close);
vLLM's CPU tier and scheduler logic beyond the stand-in; a GPU: here every
"device" is host shared memory, so the daemon's Load is a host memcpy
(on a GPU it would be cudaMemcpy from pinned pool pages) and the
memcpy/fs copies are host copies (on a GPU, vLLM's CPU -> GPU DMA). The
bytes table counts host memory only (GPU KV caches aside).

  HOSTKVD=build/server/hostkvd HOSTKV_PROTO_DIR=build/client/python/hostkv_proto \\
  PYTHONPATH=client/python /usr/bin/python3 tests/bench/vllm_tiers_bench.py \\
      [--blocks=256] [--tp=1] [--layers=8] [--repeat=5] [--json=out.json]

Prints a Markdown table. Asserts no timing.
"""
import bench_env  # noqa: F401,E402 (first: Debian's python3, client/python, build/ defaults)
import os

os.environ["PYTHONHASHSEED"] = "0"  # vLLM's block hashes: the same in every instance

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "vllm"))

MODEL = "bench/vllm-tiers"
KV_HEADS, HEAD_SIZE, BLOCK_TOKENS = 8, 128, 16
INSTANCES = 4  # for the bytes table


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


def runs_of(ids):
    """[(first index in ids, first block id, length)] of consecutive ids."""
    out = []
    for i, b in enumerate(ids):
        if out and out[-1][1] + out[-1][2] == b:
            out[-1][2] += 1
        else:
            out.append([i, b, 1])
    return [tuple(r) for r in out]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=256, help="KV blocks hit (N)")
    parser.add_argument("--tp", type=int, default=1, help="ranks (the KV heads split over them)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats (median)")
    parser.add_argument("--request_blocks", type=int, default=16,
                        help="blocks per request (one hostkv load job each)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--build_dir", default=os.path.join(REPO, "build"))
    args = parser.parse_args()
    if args.blocks < 1 or args.tp < 1 or args.layers < 1 or args.repeat < 1 or \
            args.request_blocks < 1 or KV_HEADS % args.tp:
        parser.error(f"positive --blocks/--layers/--repeat/--request_blocks, and --tp "
                     f"dividing {KV_HEADS}")
    os.environ.setdefault("HOSTKV_PROTO_DIR",
                          os.path.join(args.build_dir, "client", "python", "hostkv_proto"))
    hostkvd = os.environ.get("HOSTKVD") or os.path.join(args.build_dir, "server", "hostkvd")
    logging.basicConfig(level=logging.WARNING)
    # Each repeat's reset_cache() is the bench's own doing: not worth a warning.
    logging.getLogger("hostkv.vllm").addFilter(
        lambda record: not record.getMessage().startswith("reset_cache"))

    # pylint: disable=import-outside-toplevel
    import torch
    import engine
    import hostkv
    from vllm.v1.kv_offload.base import make_offload_key

    torch.set_num_threads(1)  # the copies below are one thread's, as the daemon's per job

    class BenchInstance(engine.Instance):
        """engine.Instance with its test-only work switchable, and the
        times and GPU block ids the bench needs."""
        checks = True

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.blocks_by_req = {}
            self.usable_at = []

        def _allocate(self, request, cached):
            blocks, fresh = super()._allocate(request, cached)
            self.blocks_by_req[request.req_id] = blocks[0]
            return blocks, fresh

        def _scribble(self, block_ids):
            if self.checks:
                super()._scribble(block_ids)

        def _check_loaded(self, request, blocks, hits):
            self.usable_at.append(time.perf_counter())
            if self.checks:
                super()._check_loaded(request, blocks, hits)

    def time_loads(inst):
        """Wraps each rank's HostkvWorker: submit_load and the report of a
        load job are timed (perf_counter), per job id and rank."""
        log = {"submit": [], "done": []}
        for w in inst.workers:
            hw = w.worker
            submit, report = hw.submit_load, hw._report  # pylint: disable=protected-access

            def timed_submit(job_id, src, dst, _submit=submit):
                log["submit"].append(time.perf_counter())
                return _submit(job_id, src, dst)

            def timed_report(job, _report=report):
                if job.kind == "load":
                    log["done"].append(time.perf_counter())
                return _report(job)

            hw.submit_load = timed_submit
            hw._report = timed_report  # pylint: disable=protected-access
        return log

    n, tp, layers = args.blocks, args.tp, args.layers
    spec = engine.full(block=BLOCK_TOKENS, heads=KV_HEADS // tp, head_size=HEAD_SIZE,
                       dtype=torch.float16)
    page = spec.page_size_bytes          # one layer of one GPU block, one rank
    per_block = page * layers            # all layers of one GPU block, one rank
    copy_bytes = n * per_block * tp      # one copy of the N blocks, every rank
    num_blocks = n + 16
    sizes = [min(args.request_blocks, n - i) for i in range(0, n, args.request_blocks)]
    prompts = [engine.prompt(s * BLOCK_TOKENS, first=1000 + i * 1_000_000)
               for i, s in enumerate(sizes)]

    def requests(tag):
        return [engine.Request(f"{tag}-{i}", p, BLOCK_TOKENS) for i, p in enumerate(prompts)]

    workdir = tempfile.mkdtemp(prefix="hostkv-tiers-bench-")
    fsdir = tempfile.mkdtemp(prefix="hostkv-fs-tier-", dir="/dev/shm")
    daemon, target = start_daemon(hostkvd, workdir)
    insts = []
    try:
        extra = {"cpu_bytes_to_use": (n + 64) * per_block * tp}
        kw = dict(layers=layers, num_blocks=num_blocks, tp=tp, model=MODEL, extra=extra,
                  events=False)
        a = BenchInstance(target, [spec], engine_id="engine-a", **kw)
        insts.append(a)
        a_reqs = requests("a")
        t0 = time.perf_counter()
        hits = a.run(a_reqs)
        a_run = time.perf_counter() - t0
        assert not any(hits.values()), f"A found blocks before it stored any: {hits}"

        # -- the fs tier's files, written by A (untimed in the table) --------------------
        keys = [make_offload_key(h, 0) for r in a_reqs for h in r.block_hashes]
        a_ids = [b for r in a_reqs for b in a.blocks_by_req[r.req_id]]
        assert len(keys) == len(a_ids) == n, (len(keys), len(a_ids), n)

        def path(key, rank):
            return os.path.join(fsdir, f"{key.hex()}.r{rank}")

        t0 = time.perf_counter()
        for rank in range(tp):
            rows = [a.caches[rank][name].view(torch.uint8) for name in a.names[0]]
            chunk = torch.empty(per_block, dtype=torch.uint8)
            for key, bid in zip(keys, a_ids):
                for li, row in enumerate(rows):
                    chunk[li * page:(li + 1) * page].copy_(row[bid])
                with open(path(key, rank), "wb") as f:
                    f.write(chunk.numpy().data)
        fs_write = time.perf_counter() - t0
        file_bytes = sum(os.path.getsize(os.path.join(fsdir, p)) for p in os.listdir(fsdir))

        # -- B -----------------------------------------------------------------------------
        b = BenchInstance(target, [spec], engine_id="engine-b", **kw)
        insts.append(b)
        load_log = time_loads(b)

        def hostkv_run(tag):
            b.sched.reset_cache()
            reqs = requests(tag)
            b.usable_at.clear()
            load_log["submit"].clear()
            load_log["done"].clear()
            t0 = time.perf_counter()
            got = b.run(reqs)
            t1 = time.perf_counter()
            missed = {rid: h for rid, h in got.items()
                      if h != len(reqs[int(rid.rsplit("-", 1)[1])].prompt_token_ids)}
            assert not missed, f"B did not hit every block: {missed}"
            assert len(load_log["done"]) == len(reqs) * tp, load_log
            return (max(b.usable_at) - t0, t1 - t0,
                    max(load_log["done"]) - min(load_log["submit"]), reqs)

        loaded_before = b.loaded_blocks
        _, _, _, warm_reqs = hostkv_run("warm0")  # checks every loaded byte
        assert b.loaded_blocks - loaded_before == n, (b.loaded_blocks, n)  # per block, all ranks
        b.checks = False
        _, _, _, warm_reqs = hostkv_run("warm1")
        dst_ids = [x for r in warm_reqs for x in b.blocks_by_req[r.req_id]]
        dst_runs = runs_of(dst_ids)

        # -- the fs model's CPU tier and the memcpy source -----------------------------------
        cpu_tier = [torch.ones((n, per_block), dtype=torch.uint8) for _ in range(tp)]
        src = [torch.ones((layers, n, page), dtype=torch.uint8) for _ in range(tp)]
        dst = [[b.caches[rank][name].view(torch.uint8) for name in b.names[0]]
               for rank in range(tp)]
        pool = ThreadPoolExecutor(tp) if tp > 1 else None

        def per_rank(fn):
            if pool is None:
                return [fn(0)]
            return list(pool.map(fn, range(tp)))

        def memcpy(rank):
            t0 = time.perf_counter()
            for li, d in enumerate(dst[rank]):
                s = src[rank][li]
                for i, bid, k in dst_runs:
                    d[bid:bid + k].copy_(s[i:i + k])
            return time.perf_counter() - t0

        def fs_read_copy(rank):
            t0 = time.perf_counter()
            buf = cpu_tier[rank]
            for i, key in enumerate(keys):
                with open(path(key, rank), "rb", buffering=0) as f:
                    got = f.readinto(buf[i].numpy().data)
                assert got == per_block, (got, per_block)
            t1 = time.perf_counter()
            for li, d in enumerate(dst[rank]):
                s = buf[:, li * page:(li + 1) * page]
                for i, bid, k in dst_runs:
                    d[bid:bid + k].copy_(s[i:i + k])
            t2 = time.perf_counter()
            return t1 - t0, t2 - t1, t2 - t0

        per_rank(memcpy)
        per_rank(fs_read_copy)
        # The fs model's bytes: A's KV at A's blocks (checked once, before B's
        # loads put other blocks' bytes at these ids).
        for rank in range(tp):
            for li, name in enumerate(a.names[0]):
                want = a.caches[rank][name].view(torch.uint8)[a_ids]
                if not torch.equal(dst[rank][li][dst_ids], want):
                    raise AssertionError(f"fs model: rank {rank} layer {li} differs from A's KV")

        rows = {k: [] for k in ("memcpy", "fs_read", "fs_copy", "fs", "hostkv_usable",
                                "hostkv_run", "hostkv_loads")}
        for rep in range(args.repeat):
            rows["memcpy"].append(max(per_rank(memcpy)))
            fs = per_rank(fs_read_copy)
            rows["fs_read"].append(max(x[0] for x in fs))
            rows["fs_copy"].append(max(x[1] for x in fs))
            rows["fs"].append(max(x[2] for x in fs))
            usable, whole, loads, _ = hostkv_run(f"r{rep}")
            rows["hostkv_usable"].append(usable)
            rows["hostkv_run"].append(whole)
            rows["hostkv_loads"].append(loads)
            print(f"repeat {rep + 1}/{args.repeat}: memcpy {rows['memcpy'][-1] * 1e3:.1f} ms, "
                  f"fs {rows['fs'][-1] * 1e3:.1f} ms, hostkv usable "
                  f"{usable * 1e3:.1f} ms", file=sys.stderr)
        if pool is not None:
            pool.shutdown()

        with hostkv.Client(target, "bench-stats") as c:
            stats = c.get_pool_stats()
        pool_used = sum(p.used_bytes for p in stats.pools)
        pool_capacity = sum(p.capacity_bytes for p in stats.pools)
    finally:
        for inst in insts:
            try:
                inst.close()
            except Exception as e:  # pylint: disable=broad-except
                print(f"closing an instance: {e}", file=sys.stderr)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(fsdir, ignore_errors=True)

    base = statistics.median(rows["memcpy"])
    labels = [
        ("memcpy", "memcpy baseline: host tensor -> KV tensors (torch copy_)"),
        ("fs", "fs tier model: read files into the CPU tier + copy into KV"),
        ("fs_read", "  of which: read N files (/dev/shm) into the CPU tier"),
        ("fs_copy", "  of which: copy CPU tier -> KV tensors"),
        ("hostkv_loads", "hostkv: B's load jobs, first submit -> last done"),
        ("hostkv_usable", "hostkv: B.run() until the KV is usable"),
        ("hostkv_run", "hostkv: B.run() whole (+ finishing step)"),
    ]
    mib = copy_bytes / 2**20
    table_rows = []
    for key, label in labels:
        med = statistics.median(rows[key])
        table_rows.append({"what": label.strip(), "key": key, "median_ms": med * 1e3,
                           "min_ms": min(rows[key]) * 1e3, "max_ms": max(rows[key]) * 1e3,
                           "ratio_vs_memcpy": med / base, "gb_per_s": copy_bytes / med / 1e9,
                           "runs_ms": [v * 1e3 for v in rows[key]]})
    bytes_rows = [
        {"tier": "hostkv (one pool in hostkvd, shared)", "copies": 1,
         "bytes": copy_bytes, "measured": f"pool used_bytes {pool_used}",
         "second_instance": "hit (loads from the pool)"},
        {"tier": "vLLM fs tier (/dev/shm files + each instance's CPU tier)",
         "copies": 1 + INSTANCES, "bytes": file_bytes + INSTANCES * copy_bytes,
         "measured": f"files {file_bytes}",
         "second_instance": "hit (file -> its CPU tier -> GPU)"},
        {"tier": "vLLM CPU offloading only (private CPU tiers)", "copies": INSTANCES,
         "bytes": INSTANCES * copy_bytes, "measured": "",
         "second_instance": "miss: recomputes the prefill"},
    ]
    config = {"blocks": n, "tp": tp, "layers": layers, "kv_heads": KV_HEADS,
              "head_size": HEAD_SIZE, "block_tokens": BLOCK_TOKENS, "dtype": "float16",
              "page_bytes": page, "block_bytes_per_rank": per_block,
              "bytes_per_copy": copy_bytes, "requests": len(sizes),
              "request_blocks": args.request_blocks, "repeat": args.repeat,
              "cpus": os.cpu_count(), "instances_for_bytes": INSTANCES,
              "pool_capacity_bytes": pool_capacity, "a_run_ms": a_run * 1e3,
              "fs_write_ms": fs_write * 1e3}

    print(f"\nA warm hit of {n} KV blocks in a second vLLM instance (CPU backend), "
          f"{layers} layers x {KV_HEADS // tp} KV heads x {HEAD_SIZE} fp16 per rank, tp {tp}: "
          f"{per_block // 1024} KiB per block per rank, {mib:.1f} MiB in all; "
          f"{len(sizes)} requests of <= {args.request_blocks} blocks; median of "
          f"{args.repeat}; {os.cpu_count()} CPUs\n")
    print("| what | median ms (min-max) | GB/s | vs memcpy |")
    print("|---|--:|--:|--:|")
    for r in table_rows:
        print(f"| {r['what']} | {r['median_ms']:.2f} ({r['min_ms']:.2f}-{r['max_ms']:.2f}) | "
              f"{r['gb_per_s']:.2f} | {r['ratio_vs_memcpy']:.2f}x |")
    print(f"\nHost bytes for {INSTANCES} instances of the model holding the same {n} blocks "
          f"({mib:.1f} MiB a copy; GPU KV caches aside):\n")
    print("| host tier | copies | MiB | vs hostkv | a second instance | measured here |")
    print("|---|--:|--:|--:|---|---|")
    for r in bytes_rows:
        print(f"| {r['tier']} | {r['copies']} | {r['bytes'] / 2**20:.1f} | "
              f"{r['bytes'] / copy_bytes:.1f}x | {r['second_instance']} | {r['measured']} |")
    print(f"\n(untimed above: A's run, storing through hostkvd, {a_run * 1e3:.0f} ms with the "
          f"engine's test writes; writing the fs model's files {fs_write * 1e3:.0f} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": config, "rows": table_rows, "bytes": bytes_rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
