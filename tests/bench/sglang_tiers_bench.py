#!/usr/bin/python3
"""A warm hit on a --tokens prefix in a SECOND SGLang instance of the same
model, three ways, beside a bare memcpy, in one run on the CPU backend; and
the host bytes 4 such instances hold.

One hostkvd (CPU backend, a private unix socket, started with
tests/python/conftest.py's Daemon) and SGLang instances in miniature over
the SGLang stand-in (tests/python/sglang_standin, aliased as `sglang` for
the whole run by sglang_linker_driver.standin()). One model: MHA, --layers
layers x --kv_heads KV heads x --head_dim, bf16, page size --page_size,
TP 1. Instance A computes the prefix and hands it to its tier (untimed);
instance B, a fresh instance of the same model on the same node, then gets
the prefix into its device KV buffers. Each repeat, in this order (all rows
see the same noise):

  memcpy      the floor: torch copy_ of the prefix's bytes from one
              pre-faulted host tensor (K/V x layer x token) into linker
              B's device KV tensors at the slots its loads use, one copy_
              per (plane, layer, run of consecutive slots).
  fresh       a reference, not a tier: torch.empty + fill_ of the prefix's
              size, i.e. what a temporary that large costs (glibc mmaps a
              block >= 32 MiB, so every one is fresh memory: page faults).
  linker      (a) hostkv.sglang.linker.HostkvLinker, SGLang main's external
              linker of the unified radix cache (no host pool in the
              engine), driven by tests/python/sglang_linker_driver.py
              (Engine.request: page hashes, lookup() = Lookup(acquire),
              load() + start_layer_wise_loading() = one Load of every page,
              the forward pass's per-layer wait_until, then poll(): the
              completed load's lease released). B.forget_device() before
              each run (untimed): B's device prefix cache empty, as in a
              fresh instance. Timed: B.request() whole, its match (hashes +
              lookup), until layer 0 is in place, until the last layer is.
              The driver's byte-for-byte check of every loaded row is
              skipped in the plain rows (a subclass keeps the waits) and
              timed in its own row ("with the driver's check").
  hostkv stor (b) hostkv.sglang.HostkvStorage, SGLang's HiCache storage
              backend on hostkvd (dynamic backend, interface_v1), driven by
              the stand-in's HiCacheController through its HiRadixCache-like
              driver (hiradix_cache.HiRadixDriver) in SGLang's order: the
              scheduler's hit query (batch_exists), prefetch_from_storage
              (the prefetch thread's batch_exists again, the host pages
              allocated, the I/O thread's batch_get_v1 into the instance's
              host pool, the acks through the sync thread), then load_back
              + start_loading (the host pool's load_to_device_per_layer,
              layer by layer) and the forward pass's per-layer waits. Two
              host pools: SGLang's own in-process MHATokenToKVPoolHost (a
              MODEL of it: sglang_model.InProcessHostPool with SGLang's
              --hicache-mem-layout shapes; its per-layer host -> device
              copy, a CUDA kernel in SGLang, is torch copy_ per run of
              consecutive slots here), where batch_get_v1 copies from
              hostkvd's mapped pool with torch (hostkv.sglang.page_copy:
              index_select of the batch's pages into a new temporary, then
              index_copy_ into the host pool); and hostkv's remote host
              pool (RemoteMHATokenToKVPoolHost, what hostkv.sglang.install()
              puts in SGLang's place), whose pages live in hostkvd: there
              batch_get_v1 is a CopyPages inside the daemon and the load a
              daemon Load. After each run B's device and host pages are
              freed again (untimed).
  file model  (c) a MODEL of SGLang's HiCache with its file backend
              (HiCacheFile, python/sglang/srt/mem_cache/hicache_storage.py):
              NOT SGLang's code. A class of this file written from
              HiCacheFile's behaviour (one file "<key>_<model>_<rank>_<tp>
              .bin" per page key in one directory, here a temp dir in
              /dev/shm; set() writes get_data_page(flat) with tofile;
              batch_exists lists the directory (scandir); get() readinto()s
              the file into the flat page the controller passes), registered
              as a built-in-style backend and driven by the same stand-in
              controller as (b) with the same in-process host pool model.
              The controller's generic (non-zero-copy) path, as SGLang takes
              it for "file": per page a get_dummy_flat_data_page(), batch_get
              (read each file into it), set_from_flat_data_page (copy into
              the host pool); then host pool -> device as (b). SGLang's
              dummy page is torch.zeros(pin_memory=True), which CUDA's
              caching host allocator serves from blocks it keeps; the model
              hands out pre-faulted pages from a ring and zeroes them (the
              memset stays, the page faults go: the model's best case).
              B's hit query reads the directory (scandir) twice, as (b)'s
              asks hostkvd twice: the scheduler's query, the prefetch
              thread's.

Every HiCache row has the same breakdown: the scheduler's hit query, the
prefetch (storage -> host pool; "of which get" is the backend's batch_get_v1
/ batch_get + set_from_flat_data_page, timed inside the I/O thread), and
host -> device. The warm-up before timing checks, for every path, every
byte B ends up with against what A computed; one timed run of each path
before the repeats warms everything up. All copies in this process
are one thread's (torch.set_num_threads(1)); hostkvd copies on its
--copy_threads (one on 2 CPUs). Ratios are median / median of memcpy.

What this does not show: SGLang itself (the controller, tree cache,
scheduler and host pool are the stand-in and models of them, rebuilt from
SGLang's source); the real HiCacheFile (its v2 payloads, key suffixes of
newer trees, and the disk: /dev/shm is its best case); a GPU. On the CPU
backend every "device" is host shared memory: hostkvd's Load is a host
memcpy (on a GPU, cudaMemcpy from pinned pool pages), SGLang's host ->
device kernel is a torch copy_ here, and the stand-in's L2 engine runs a
load's layers one after another before start_loading returns (on CUDA they
overlap the forward pass; the linker's layer-0 row is the only view of
that here). Page faults: on the VM this was written on, touching fresh
memory costs about 3 ms per MiB (the "fresh" row), which a path that
allocates per call pays in full; elsewhere it is cheaper. The bytes table
counts host memory only.

  cd /work/main && HOSTKVD=build/server/hostkvd \\
  HOSTKV_PROTO_DIR=build/client/python/hostkv_proto \\
  PYTHONPATH=client/python:tests/python PYTHONHASHSEED=0 \\
  /usr/bin/python3 tests/bench/sglang_tiers_bench.py [--tokens=4096] \\
      [--page_size=64] [--layers=8] [--kv_heads=4] [--head_dim=128] \\
      [--layout=page_first] [--repeat=5] [--json=out.json]

Prints Markdown tables. Asserts no timing.
"""
import bench_env  # noqa: F401,E402 (first: Debian's python3, client/python, build/ defaults)
import argparse
import functools
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
sys.path.insert(0, os.path.join(REPO, "client", "python"))

MODEL = "bench/sglang-tiers"
INSTANCES = 4  # for the bytes table
FILE_BACKEND = "file_model"
STORAGE_BATCH_SIZE = 128  # SGLang's: the most pages one batch_get carries

# -- stand-in classes (need torch and the stand-in; built in main()) -------------------

FileBackendModel = None  # the HiCacheFile model; a class once main() defines it
_FILE_DIR = None         # its directory (HiCacheFile: $SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR)


def pair_runs(torch, a, b):
    """[(a0, b0, n)]: index pairs consecutive in both int64 tensors."""
    if a.numel() == 0:
        return []
    brk = ((a[1:] - a[:-1]) != 1) | ((b[1:] - b[:-1]) != 1)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), brk.nonzero().flatten() + 1])
    ends = torch.cat([starts[1:], torch.tensor([a.numel()])])
    return list(zip(a[starts].tolist(), b[starts].tolist(), (ends - starts).tolist()))


def define_classes(torch):
    """The bench's classes over the stand-in (imported inside standin())."""
    # pylint: disable=import-outside-toplevel,global-statement
    import sglang_linker_driver as drv
    import sglang_model
    from hostkv.sglang import page_copy
    from sglang_standin.srt.mem_cache import memory_pool
    from sglang_standin.srt.mem_cache.hicache_storage import HiCacheStorage
    from sglang_standin.srt.mem_cache.storage import StorageBackendFactory
    from sglang_standin.srt.runtime_context import set_memory

    class BenchDevice(sglang_model.DevicePool, memory_pool.MHATokenToKVPool):
        """sglang_model's device pool as SGLang's MHATokenToKVPool,
        pre-faulted (a GPU's KV cache is allocated up front)."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.kv.view(torch.uint8).fill_(drv.NOISE)

    class HostPoolModel(sglang_model.InProcessHostPool):
        """A MODEL of SGLang's own MHATokenToKVPoolHost (in-process, one per
        instance) with SGLang's constructor: sglang_model's buffer in the
        layout's shape, allocated and touched in full at start (SGLang pins
        it), per-layer load and all-layer backup as torch copy_ per run of
        consecutive slots (SGLang: transfer_kv_* kernels), flat pages as
        get_data_page / set_from_flat_data_page use them."""

        def __init__(self, device_pool, host_to_device_ratio, host_size, page_size, layout,
                     pin_memory=True, device="cpu", allocator_type="default",
                     host_page_num=None):
            del pin_memory, device, allocator_type
            assert host_size == 0 and host_page_num is None and page_size == device_pool.page_size
            super().__init__(device_pool, layout, ratio=host_to_device_ratio)
            self.size_per_token = (2 * self.layer_num * self.head_num * self.head_dim
                                   * self.kv_buffer.element_size())
            self.kv_buffer.zero_()
            self._staging, self._next_staging = None, 0

        def get_size_per_token(self):
            return self.size_per_token

        def available_size(self):
            with self.lock:
                return len(self._free) * self.page_size

        def clear(self):
            with self.lock:
                self._free = list(range(self.page_num))

        def _layer(self, plane, layer):
            """(slots, H, D) view of one plane's layer."""
            b = self.kv_buffer[plane]
            return b[layer] if self.layout == "layer_first" else b[:, layer]

        def load_to_device_per_layer(self, device_pool, host_indices, device_indices,
                                     layer_id, io_backend, *, is_draft=False):
            del io_backend, is_draft
            runs = pair_runs(torch, host_indices, device_indices)
            for plane, layers in enumerate(device_pool.planes()):
                src, dst = self._layer(plane, layer_id), layers[layer_id]
                for h, d, n in runs:
                    dst[d:d + n].copy_(src[h:h + n])

        def backup_from_device_all_layer(self, device_pool, host_indices, device_indices,
                                         io_backend):
            del io_backend
            runs = pair_runs(torch, host_indices, device_indices)
            for plane, layers in enumerate(device_pool.planes()):
                for layer in range(self.layer_num):
                    dst, src = self._layer(plane, layer), layers[layer]
                    for h, d, n in runs:
                        dst[h:h + n].copy_(src[d:d + n])

        def get_dummy_flat_data_page(self):
            """SGLang: torch.zeros(page, pin_memory=True), one per page of a
            batch; on a GPU machine CUDA's caching host allocator hands the
            same pinned blocks out again. Here: a ring of pre-faulted pages
            (as many as one batch can hold at once, plus one), zeroed on
            hand-out (the memset torch.zeros does)."""
            if self._staging is None:
                numel = 2 * self.layer_num * self.page_size * self.head_num * self.head_dim
                count = min(STORAGE_BATCH_SIZE, self.page_num) + 1
                self._staging = [torch.ones(numel, dtype=self.dtype) for _ in range(count)]
            page = self._staging[self._next_staging % len(self._staging)]
            self._next_staging += 1
            return page.zero_()

        def set_from_flat_data_page(self, index, data_page):
            view = page_copy.page_view(self.kv_buffer, self.layout, True, int(index),
                                       self.page_size)
            view.copy_(data_page.view(view.shape))

    class _FileBackendModel(HiCacheStorage):
        """A MODEL of SGLang's HiCacheFile (not its code): one file per page
        key, named key + "_<model>_<tp_rank>_<tp_size>" + ".bin", in one
        directory; what its get / set / exists / batch_exists do."""

        def __init__(self, storage_config):
            self.file_path = _FILE_DIR
            model = "-".join(storage_config.model_name.split("/"))
            self.suffix = f"_{model}_{storage_config.tp_rank}_{storage_config.tp_size}"

        def _path(self, key):
            return os.path.join(self.file_path, f"{key}{self.suffix}.bin")

        def get(self, key, target_location=None, target_sizes=None):
            expected = target_location.numel() * target_location.element_size()
            try:
                with open(self._path(key), "rb", buffering=0) as f:
                    if f.readinto(target_location.view(torch.uint8).numpy().data) != expected:
                        raise IOError(f"short read for {key}")
            except FileNotFoundError:
                return None
            return target_location

        def batch_get(self, keys, target_locations=None, target_sizes=None):
            return [self.get(k, t) for k, t in zip(keys, target_locations)]

        def set(self, key, value=None, target_location=None, target_sizes=None):
            if self.exists(key):
                return True
            value.contiguous().view(torch.uint8).numpy().tofile(self._path(key))
            return True

        def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
            return all(self.set(k, v) for k, v in zip(keys, values))

        def exists(self, key):
            return os.path.exists(self._path(key))

        def batch_exists(self, keys, extra_info=None):
            with os.scandir(self.file_path) as entries:
                present = {e.name for e in entries if e.is_file()}
            for i, key in enumerate(keys):
                if os.path.basename(self._path(key)) not in present:
                    return i
            return len(keys)

    global FileBackendModel
    FileBackendModel = _FileBackendModel
    StorageBackendFactory.register_backend(FILE_BACKEND, __name__, "FileBackendModel",
                                           "config")

    class LinkerRank(drv.Rank):
        """drv.Rank with this bench's KV heads and head_dim (the driver's
        are 2 x 8); otherwise its constructor, line for line."""

        # pylint: disable-next=super-init-not-called
        def __init__(self, target, model, layers, slots, page_size, rank, tp, extra,
                     heads, head_dim):
            self.pool = sglang_model.DevicePool("mha", layers, slots, page_size,
                                                dtype=torch.bfloat16, head_num=heads,
                                                head_dim=head_dim)
            self.pool.kv.view(torch.uint8).fill_(drv.NOISE)
            self.kv = drv._Kv(self.pool)  # pylint: disable=protected-access
            from sglang.srt.mem_cache.unified_cache.components import ComponentType
            from sglang.srt.mem_cache.unified_cache.linker_factory import \
                create_unified_cache_linker
            config = {"linker": "HostkvLinker", "linker_module_path": "hostkv.sglang.linker",
                      "linker_extra_config": dict({"hostkv_target": target, "tp_rank": rank,
                                                   "tp_size": tp}, **(extra or {}))}
            previous = set_memory(enable_unified_cache_external_linker=True,
                                  unified_cache_external_linker_config=config)
            try:
                # pylint: disable=protected-access
                self.linker = create_unified_cache_linker(drv._ServerArgs(model),
                                                          drv._Params(self.kv, page_size),
                                                          components={ComponentType.FULL})
            finally:
                set_memory(**previous)
            self.kv.register_layer_transfer_counter(self.linker.layer_done_counter)

    class LinkerEngine(drv.Engine):
        """drv.Engine with wider KV rows, the times of one request, and the
        byte check switchable (the per-layer waits stay)."""
        checks = True

        # pylint: disable-next=super-init-not-called
        def __init__(self, target, model, layers, pages, page_size, extra, heads, head_dim):
            self.page_size, self.layers, self.tp = page_size, layers, 1
            self.heads, self.head_dim = heads, head_dim
            self.ranks = [LinkerRank(target, model, layers, pages * page_size, page_size, 0, 1,
                                     extra, heads, head_dim)]
            self.free = list(range(0, pages * page_size, page_size))
            self.device = {}
            self.offloads = self.stored = self.offload_failures = 0
            self.loaded_pages = self.rows_checked = 0
            self.marks = {}

        def expected(self, rank, plane, layer, page_hash):
            # drv.Engine.expected with (page_size, heads, head_dim) rows
            import hashlib  # pylint: disable=import-outside-toplevel
            digest = hashlib.sha256(f"{page_hash}/{rank}/{plane}/{layer}".encode()).digest()
            gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
            return torch.randn((self.page_size, self.heads, self.head_dim),
                               generator=gen).to(torch.bfloat16)

        def match(self, rid, tokens):
            got = super().match(rid, tokens)
            self.marks["matched"] = time.perf_counter()
            return got

        def _check_layer(self, r, layer, pages):
            if self.checks:
                super()._check_layer(r, layer, pages)
            else:
                kv = self.ranks[r].kv
                kv.get_key_buffer(layer)   # waits for the layer
                kv.get_value_buffer(layer)
            self.marks.setdefault("layer0", time.perf_counter())
            self.marks["last_layer"] = time.perf_counter()

    return BenchDevice, HostPoolModel, LinkerEngine


# -- the bench ---------------------------------------------------------------------------

def main():
    # pylint: disable=too-many-locals,too-many-statements
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--tokens", type=int, default=4096, help="prefix length (whole pages)")
    parser.add_argument("--page_size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--kv_heads", type=int, default=4)
    parser.add_argument("--head_dim", type=int, default=128)
    parser.add_argument("--layout", default="page_first", choices=["page_first", "layer_first"],
                        help="SGLang's --hicache-mem-layout for the HiCache host pools")
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats (median)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--build_dir", default=os.path.join(REPO, "build"))
    args = parser.parse_args()
    if min(args.tokens, args.page_size, args.layers, args.kv_heads, args.head_dim,
           args.repeat) < 1 or args.tokens % args.page_size:
        parser.error("positive sizes, and --tokens a multiple of --page_size")
    os.environ.setdefault("HOSTKVD", os.path.join(args.build_dir, "server", "hostkvd"))
    os.environ.setdefault("HOSTKV_PROTO_DIR",
                          os.path.join(args.build_dir, "client", "python", "hostkv_proto"))
    logging.basicConfig(level=logging.WARNING)

    # pylint: disable=import-outside-toplevel
    import torch
    import hostkv
    import sglang_linker_driver as drv
    import sglang_standin
    from conftest import Daemon

    torch.set_num_threads(1)
    global _FILE_DIR  # pylint: disable=global-statement
    n, ps, layers, heads, hdim = (args.tokens, args.page_size, args.layers, args.kv_heads,
                                  args.head_dim)
    pages = n // ps
    token_bytes = 2 * layers * heads * hdim * 2  # K and V, bf16
    prefix_bytes = n * token_bytes
    tokens = list(range(1000, 1000 + n))

    workdir = tempfile.mkdtemp(prefix="hostkv-sglang-tiers-")
    _FILE_DIR = tempfile.mkdtemp(prefix="hostkv-hicache-file-", dir="/dev/shm")
    daemon = Daemon("--log_level=warn")
    target = daemon.target
    linkers, drivers = [], []
    try:
        with drv.standin(), sglang_standin.as_sglang(reimport=("hostkv.sglang.storage",)):
            from hostkv.sglang import RemoteMHATokenToKVPoolHost
            from sglang_standin.srt.mem_cache import hiradix_cache
            from sglang_standin.srt.mem_cache.allocator import TokenToKVPoolAllocator
            from sglang_standin.srt.mem_cache.utils import get_hash_str
            BenchDevice, HostPoolModel, LinkerEngine = define_classes(torch)
            keys = get_hash_str(tokens, None, page_size=ps)
            assert len(keys) == pages

            # The prefix's KV (A's computation for the HiCache paths) and the
            # memcpy source: (K/V, layer, token, H, D), pre-faulted.
            gen = torch.Generator().manual_seed(7)
            src = torch.randn((2, layers, n, heads, hdim), generator=gen).to(torch.bfloat16)

            # -- (a) the linker ------------------------------------------------------------
            lk = dict(model=MODEL, layers=layers, pages=pages + 1, page_size=ps,
                      extra={"hostkv_capacity_bytes": 2 * prefix_bytes + (1 << 20)},
                      heads=heads, head_dim=hdim)
            la = LinkerEngine(target, **lk)
            linkers.append(la)
            t0 = time.perf_counter()
            assert la.request("a", tokens) == []  # computed, offloaded
            la.poll(wait_offloads=True)
            a_linker_s = time.perf_counter() - t0
            assert la.stored == 1 and la.offload_failures == 0, (la.stored, la.offload_failures)
            lb = LinkerEngine(target, **lk)
            linkers.append(lb)

            def linker_run(rid, checks):
                lb.forget_device()
                lb.checks = checks
                lb.marks.clear()
                before = lb.rows_checked
                t0 = time.perf_counter()
                loaded = lb.request(rid, tokens)
                t1 = time.perf_counter()
                assert len(loaded) == pages, (len(loaded), pages)
                if checks:
                    assert lb.rows_checked - before == pages * 2 * layers
                m = lb.marks
                return {"linker": t1 - t0, "linker_match": m["matched"] - t0,
                        "linker_layer0": m["layer0"] - t0,
                        "linker_load": m["last_layer"] - m["matched"]}, loaded

            _, loaded = linker_run("b-warm0", True)   # every loaded byte checked
            linker_run("b-warm1", False)
            slots = torch.tensor([s + i for _, s in loaded for i in range(ps)])
            dst_runs = pair_runs(torch, torch.arange(n), slots)
            lb_planes = lb.ranks[0].pool.planes()

            def memcpy():
                t0 = time.perf_counter()
                for p, plane in enumerate(lb_planes):
                    for layer in range(layers):
                        s, d = src[p, layer], plane[layer]
                        for i, slot, k in dst_runs:
                            d[slot:slot + k].copy_(s[i:i + k])
                return time.perf_counter() - t0

            # -- (b), (c): HiCache engines through the stand-in controller -------------------
            def hicache(backend, remote, pool_name=None):
                device = BenchDevice("mha", layers, size=n + 2 * ps, page_size=ps,
                                     dtype=torch.bfloat16, head_num=heads, head_dim=hdim)
                allocator = TokenToKVPoolAllocator(device.size, ps, device)
                if remote:
                    host_cls = functools.partial(RemoteMHATokenToKVPoolHost, target=target,
                                                 pool_name=pool_name)
                else:
                    host_cls = HostPoolModel
                classes = hiradix_cache.HostPoolClasses(MHATokenToKVPoolHost=host_cls,
                                                        MLATokenToKVPoolHost=None)
                if backend == "hostkv":
                    extra = {"backend_name": "hostkv", "module_path": "hostkv.sglang.storage",
                             "class_name": "HostkvStorage", "interface_v1": True,
                             "target": target, "prefetch_threshold": ps}
                    storage = "dynamic"
                else:
                    extra, storage = {"prefetch_threshold": ps}, FILE_BACKEND
                server = hiradix_cache.ServerArgs(
                    hicache_ratio=2.0, hicache_mem_layout=args.layout,
                    hicache_io_backend="kernel", hicache_storage_backend=storage,
                    hicache_storage_backend_extra_config=json.dumps(extra),
                    served_model_name=MODEL)
                params = hiradix_cache.CacheInitParams(token_to_kv_pool_allocator=allocator,
                                                       page_size=ps)
                d = hiradix_cache.HiRadixDriver(params, server, classes)
                drivers.append(d)
                return device, allocator, d

            def compute_and_store(variant):
                """Instance A: the prefix's KV on its device, written through
                to its host pool, backed up to storage; its host pages freed
                (they are A's, and B's tier is what is measured)."""
                device, allocator, a = hicache(*variant)
                dev_idx = allocator.alloc(n)
                first = int(dev_idx[0])
                assert torch.equal(dev_idx, torch.arange(first, first + n))
                for p, plane in enumerate(device.planes()):
                    for layer in range(layers):
                        plane[layer][first:first + n].copy_(src[p, layer])
                host_a = a.write_backup(dev_idx, node_id=1)
                assert host_a is not None and a.writing_check() == [1]
                op_id = a.write_backup_storage(host_a, tokens, keys)
                assert a.wait_backup(op_id, timeout=60).completed_tokens == n
                a.evict_host(host_a)
                return a

            variants = {"stor": ("hostkv", False), "remote": ("hostkv", True, "bench-hicache"),
                        "file": ("file", False)}
            t0 = time.perf_counter()
            for variant in variants.values():
                compute_and_store(variant)
            a_hicache_s = time.perf_counter() - t0
            b_engines = {k: hicache(*v) for k, v in variants.items()}
            get_time = {}

            def time_gets(key, d):
                """The backend's page get, timed on the I/O thread."""
                backend, host = d.cache_controller.storage_backend, d.token_to_kv_pool_host
                names = ["batch_get_v1"] if variants[key][0] == "hostkv" else ["batch_get"]
                objs = [backend]
                if variants[key][0] == "file":
                    names.append("set_from_flat_data_page")
                    objs.append(host)
                for obj, name in zip(objs, names):
                    real = getattr(obj, name)

                    def timed(*a, _real=real, **kw):
                        t = time.perf_counter()
                        try:
                            return _real(*a, **kw)
                        finally:
                            get_time[key] = get_time.get(key, 0.0) + time.perf_counter() - t
                    setattr(obj, name, timed)

            for key, (_, _, d) in b_engines.items():
                time_gets(key, d)
            counter = {"node": 10}

            def hicache_run(key, check=False):
                device, _, b = b_engines[key]
                cc = b.cache_controller
                counter["node"] += 1
                rid = f"b-{key}-{counter['node']}"
                get_time[key] = 0.0
                t0 = time.perf_counter()
                hashes, hits = b.query_storage_hit_length(tokens)
                t1 = time.perf_counter()
                assert hits == n and hashes == keys, (key, hits)
                op = b.prefetch_from_storage(rid, tokens)
                assert b.drain_prefetch_hit(timeout=60) is op and op.host_indices is not None
                b.wait_prefetch(op, timeout=60)
                assert b.check_prefetch_progress(op) == n, key
                t2 = time.perf_counter()
                target_idx = b.load_back(op.host_indices[:n], node_id=counter["node"])
                assert target_idx is not None
                producer = b.ready_to_load_host_cache()
                cc.layer_done_counter.set_consumer(producer)
                for layer in range(layers):  # the forward pass
                    device.get_key_buffer(layer)
                    device.get_value_buffer(layer)
                assert b.is_load_back_event_done(producer)
                t3 = time.perf_counter()
                if check:
                    for p, plane in enumerate(device.planes()):
                        for layer in range(layers):
                            got = plane[layer][target_idx].view(torch.int16)
                            if not torch.equal(got, src[p, layer].view(torch.int16)):
                                raise AssertionError(f"{key}: plane {p} layer {layer} is not "
                                                     "A's KV")
                cc.evict_device(target_idx)
                cc.evict_host(op.host_indices)
                assert b.drain_storage_control_queues() == []
                assert cc.storage_thread_errors == [], cc.storage_thread_errors
                return {key: t3 - t0, f"{key}_query": t1 - t0, f"{key}_prefetch": t2 - t1,
                        f"{key}_get": get_time[key], f"{key}_load": t3 - t2}

            for key in variants:  # warm-up: checked, then plain
                hicache_run(key, check=True)
                hicache_run(key)
            memcpy()

            rows = {}

            def add(times):
                for k, v in times.items():
                    rows.setdefault(k, []).append(v)

            def fresh_memory():
                """What a temporary of the prefix's size costs: a fresh
                allocation's page faults (glibc mmaps blocks >= 32 MiB)."""
                t0 = time.perf_counter()
                x = torch.empty(prefix_bytes, dtype=torch.uint8)
                x.fill_(0)
                t = time.perf_counter() - t0
                del x
                return t

            for rep in range(args.repeat):
                add({"memcpy": memcpy()})
                add({"fresh": fresh_memory()})
                add(linker_run(f"b-{rep}", False)[0])
                for key in variants:
                    add(hicache_run(key))
                add({"linker_checked": linker_run(f"b-{rep}-checked", True)[0]["linker"]})
                print(f"repeat {rep + 1}/{args.repeat}: memcpy {rows['memcpy'][-1] * 1e3:.1f} "
                      f"ms, linker {rows['linker'][-1] * 1e3:.1f} ms, HostkvStorage "
                      f"{rows['stor'][-1] * 1e3:.1f} ms, remote {rows['remote'][-1] * 1e3:.1f}"
                      f" ms, file {rows['file'][-1] * 1e3:.1f} ms", file=sys.stderr)

            # -- bytes, one instance B holding the prefix -----------------------------------
            stor_pool = b_engines["stor"][2].cache_controller.storage_backend.pool_name
            remote_pool = variants["remote"][2]
            linker_pool = lb.ranks[0].linker.pools["kv"]
            op_pages = {}
            for key in ("stor", "remote", "file"):  # B's host pool holding the prefix
                _, _, b = b_engines[key]
                op = b.prefetch_from_storage(f"bytes-{key}", tokens)
                b.drain_prefetch_hit(timeout=60)
                b.wait_prefetch(op, timeout=60)
                assert b.check_prefetch_progress(op) == n
                op_pages[key] = op
            with hostkv.Client(target, "bench-stats") as c:
                used = {p.name: p.used_bytes for p in c.get_pool_stats().pools}
                capacity = {p.name: p.capacity_bytes for p in c.get_pool_stats().pools}
            host_b = b_engines["stor"][2].token_to_kv_pool_host
            host_held = (host_b.size - host_b.available_size()) * host_b.size_per_token
            host_reserved = host_b.size * host_b.size_per_token
            file_bytes = sum(os.path.getsize(os.path.join(_FILE_DIR, f))
                             for f in os.listdir(_FILE_DIR))
            nfiles = len(os.listdir(_FILE_DIR))
            for key, op in op_pages.items():
                b_engines[key][2].cache_controller.evict_host(op.host_indices)
    finally:
        for e in linkers:
            try:
                e.close()
            except Exception as e_:  # pylint: disable=broad-except
                print(f"closing a linker engine: {e_}", file=sys.stderr)
        for d in drivers:
            try:
                d.shutdown()
            except Exception as e_:  # pylint: disable=broad-except
                print(f"shutting a HiCache engine down: {e_}", file=sys.stderr)
        daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(_FILE_DIR, ignore_errors=True)

    # -- report ---------------------------------------------------------------------------
    base = statistics.median(rows["memcpy"])
    labels = [
        ("memcpy", "memcpy baseline: host tensor -> device KV tensors (torch copy_)"),
        ("fresh", "reference: fresh memory of the prefix's size (torch.empty + fill_, "
                  "page faults)"),
        ("linker", "(a) HostkvLinker: B.request() whole (hashes, Lookup, Load, every layer, "
                   "release)"),
        ("linker_match", "  of which: match (page hashes + lookup = Lookup(acquire))"),
        ("linker_load", "  of which: load() + start -> last layer in place"),
        ("linker_layer0", "  request start -> layer 0 in place (the forward pass may start)"),
        ("linker_checked", "(a) the same with the driver's byte check of every row"),
    ]
    names = {"stor": "(b) HostkvStorage + SGLang's host pool (model)",
             "remote": "(b') HostkvStorage + hostkv's remote host pool",
             "file": "(c) HiCacheFile MODEL on /dev/shm + SGLang's host pool (model)"}
    gets = {"stor": "batch_get_v1 (Lookup, torch copy from the mapped pool, Release)",
            "remote": "batch_get_v1 (Lookup, CopyPages in hostkvd, Release)",
            "file": "batch_get (read each file) + set_from_flat_data_page"}
    for key, name in names.items():
        labels += [
            (key, f"{name}: hit query -> KV on device"),
            (f"{key}_query", "  of which: the scheduler's hit query (batch_exists)"),
            (f"{key}_prefetch", "  of which: prefetch, storage -> host pool (controller "
                                "threads)"),
            (f"{key}_get", f"    of which: {gets[key]}"),
            (f"{key}_load", "  of which: host pool -> device (load_back, start_loading, "
                            "per layer)"),
        ]
    table_rows = []
    for key, label in labels:
        med = statistics.median(rows[key])
        table_rows.append({"what": label.strip(), "key": key, "median_ms": med * 1e3,
                           "min_ms": min(rows[key]) * 1e3, "max_ms": max(rows[key]) * 1e3,
                           "ratio_vs_memcpy": med / base, "gb_per_s": prefix_bytes / med / 1e9,
                           "runs_ms": [v * 1e3 for v in rows[key]],
                           "indent": (len(label) - len(label.lstrip(" "))) // 2})
    copy = prefix_bytes
    bytes_rows = [
        {"tier": "(a) HostkvLinker: hostkvd's pool, shared; no host pool in the engine",
         "copies": 1, "bytes": copy,
         "measured": f"linker pool used_bytes {used.get(linker_pool, 0)} (capacity "
                     f"{capacity.get(linker_pool, 0)}, one pool for every instance)"},
        {"tier": "(b) HostkvStorage: hostkvd's pool + each instance's SGLang host pool",
         "copies": 1 + INSTANCES, "bytes": copy * (1 + INSTANCES),
         "measured": f"storage pool used_bytes {used.get(stor_pool, 0)}; B's host pool "
                     f"holds {host_held} (of {host_reserved} it allocates at start)"},
        {"tier": "(b') HostkvStorage + remote host pools (all in hostkvd)",
         "copies": 1 + INSTANCES, "bytes": copy * (1 + INSTANCES),
         "measured": f"shared pool used_bytes {used.get(remote_pool, 0)} (cached + B's host "
                     f"pages; capacity {capacity.get(remote_pool, 0)})"},
        {"tier": "(c) HiCacheFile model: files + each instance's SGLang host pool",
         "copies": 1 + INSTANCES, "bytes": file_bytes + copy * INSTANCES,
         "measured": f"{nfiles} files, {file_bytes} bytes; B's host pool as in (b)"},
    ]
    config = {"tokens": n, "page_size": ps, "pages": pages, "layers": layers,
              "kv_heads": heads, "head_dim": hdim, "dtype": "bfloat16", "layout": args.layout,
              "bytes_per_token": token_bytes, "prefix_bytes": prefix_bytes,
              "repeat": args.repeat, "cpus": os.cpu_count(), "instances_for_bytes": INSTANCES,
              "pool_capacity_bytes": capacity, "pool_used_bytes": used,
              "host_pool_reserved_bytes": host_reserved,
              "a_linker_ms": a_linker_s * 1e3, "a_hicache_ms": a_hicache_s * 1e3}
    mib = prefix_bytes / 2**20
    print(f"\nA warm hit on a {n}-token prefix in a second SGLang instance (CPU backend): "
          f"MHA {layers} layers x {heads} KV heads x {hdim}, bf16, page size {ps}, TP 1, "
          f"HiCache layout {args.layout}: {token_bytes // 1024} KiB per token, {mib:.1f} MiB, "
          f"{pages} pages; median of {args.repeat}; {os.cpu_count()} CPUs\n")
    print("| what | median ms (min-max) | GB/s | vs memcpy |")
    print("|---|--:|--:|--:|")
    for r in table_rows:
        what = "&nbsp;&nbsp;" * r["indent"] + r["what"]
        print(f"| {what} | {r['median_ms']:.2f} ({r['min_ms']:.2f}-{r['max_ms']:.2f}) | "
              f"{r['gb_per_s']:.2f} | {r['ratio_vs_memcpy']:.2f}x |")
    print(f"\nHost bytes for {INSTANCES} instances holding the same prefix ({mib:.1f} MiB a "
          f"copy; device KV caches aside):\n")
    print("| host tier | copies | MiB | vs linker | measured here (one instance B) |")
    print("|---|--:|--:|--:|---|")
    for r in bytes_rows:
        print(f"| {r['tier']} | {r['copies']} | {r['bytes'] / 2**20:.1f} | "
              f"{r['bytes'] / copy:.1f}x | {r['measured']} |")
    print(f"\n(untimed above: linker A's request + offload {a_linker_s * 1e3:.0f} ms with the "
          f"driver's page writes; the three HiCache A's write-through + storage backup "
          f"{a_hicache_s * 1e3:.0f} ms; each SGLang host pool here is allocated in full at "
          f"start: {host_reserved / 2**20:.1f} MiB, hicache_ratio 2)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"config": config, "rows": table_rows, "bytes": bytes_rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
