"""SGLang engines in miniature that drive an external linker (SGLang main's
UnifiedCacheLinker) in the order of unified_cache_linker.py's wrapper at
sgl-project/sglang 03205d15 (UnifiedCacheLinkerWrapper, read_file id
71431584660) and its callers in unified_radix_cache.py (the version with
linker hooks, id 57358901232), written from those facts:

  build      per rank: create_unified_cache_linker(server_args, params,
             components={FULL}) from --unified-cache-external-linker-config
             (linker_factory.py @2c62dc66), then the device pool's
             register_layer_transfer_counter(linker.layer_done_counter);
  match      the device prefix (whole pages found in the engine's own
             "radix tree"), the tail's page hashes chained from the last
             device page's hash (get_storage_hash_str), one LOOKUP
             PoolTransfer(KV, keys) per rank, lookup(rid, ...) on every rank,
             the sets intersected by a 0/1 mask MIN over ranks
             (_sync_restorable_prefix): the longest common length;
  load_back  device slots allocated for the hit pages, the transfer trimmed
             to the pages the tree adopts (trim=), load(rid, ...) per rank;
  batch      start_layer_wise_loading() per rank; the forward pass:
             set_consumer(index), then per layer the device pool's getter
             (wait_until(layer)), where this driver checks the layer's
             loaded rows byte for byte (the layers after it may still be on
             their way); then the tail computed, the new pages inserted;
  offload    write-through: offload([PoolTransfer(KV, keys, device
             slots)]) per rank for the new pages;
  poll       each step: MIN over ranks of num_completed_loads() and of
             num_completed_offloads(), that many pop_completed_load() /
             pop_completed_offload() per rank (results ANDed over ranks);
  abort      cancel_queued_load(rid); reset(); close().
Device pools are hostkv.torch shm tensors (the CPU backend's device
memory); a page's bytes are a function of its hash, layer, plane and rank.
"""
import hashlib

import torch

import sglang_model
import sglang_standin
from sglang_standin.srt.mem_cache import memory_pool as sp_memory_pool

NOISE = 0x5A


class _Kv(sp_memory_pool.MHATokenToKVPool):
    def __init__(self, pool):
        self.k_buffer, self.v_buffer = pool.k_buffer, pool.v_buffer
        self.start_layer = 0


class _Allocator:
    def __init__(self, kv):
        self._kv = kv

    def get_kvcache(self):
        return self._kv


class _Params:
    def __init__(self, kv, page_size):
        self.page_size = page_size
        self.token_to_kv_pool_allocator = _Allocator(kv)
        self.tree_components = ()


class _ServerArgs:
    def __init__(self, model):
        self.model_path = model


class _TpWorker:
    def __init__(self):
        self.counter = None

    def register_hicache_layer_transfer_counter(self, counter):
        self.counter = counter


def build_context(server_args, params, tp_rank, tp_size, tp_worker, **flags):
    """registry.TreeCacheBuildContext for a plain full-attention model."""
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext
    fields = dict(is_hybrid_swa=False, is_hybrid_ssm=False, enable_hierarchical_cache=False,
                  disable_radix_cache=False, effective_chunked_prefill_size=None,
                  model_config=None, tp_group=None)
    fields.update(flags)
    return TreeCacheBuildContext(server_args=server_args, params=params, tp_worker=tp_worker,
                                 tp_size=tp_size, tp_rank=tp_rank, **fields)


class Rank:
    """One TP rank: its device pool and linker, built by the linker factory
    (via="factory": --unified-cache-external-linker-config, PR #40595) or by
    hostkv's plugin (via="plugin": the radix cache backend "hostkv")."""

    def __init__(self, target, model, layers, slots, page_size, rank, tp, extra,
                 via="factory"):
        self.pool = sglang_model.DevicePool("mha", layers, slots, page_size,
                                            dtype=torch.bfloat16, head_num=2, head_dim=8)
        self.pool.kv.view(torch.uint8).fill_(NOISE)
        self.kv = _Kv(self.pool)
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.runtime_context import set_memory
        options = dict({"hostkv_target": target}, **(extra or {}))
        params = _Params(self.kv, page_size)
        if via == "plugin":
            import os  # pylint: disable=import-outside-toplevel
            from sglang.srt.mem_cache.registry import create_tree_cache
            previous = set_memory(enable_unified_cache_external_linker=True,
                                  radix_cache_backend="hostkv")
            saved = os.environ.get("HOSTKV_LINKER_CONFIG")
            os.environ["HOSTKV_LINKER_CONFIG"] = __import__("json").dumps(options)
            try:
                self.tp_worker = _TpWorker()
                self.cache = create_tree_cache(build_context(
                    _ServerArgs(model), params, rank, tp, self.tp_worker))
            finally:
                set_memory(**previous)
                if saved is None:
                    os.environ.pop("HOSTKV_LINKER_CONFIG", None)
                else:
                    os.environ["HOSTKV_LINKER_CONFIG"] = saved
            self.linker = self.cache.linker.cache_linker
            assert self.kv.layer_transfer_counter is self.linker.layer_done_counter
            assert self.tp_worker.counter is self.linker.layer_done_counter
            return
        from sglang.srt.mem_cache.unified_cache.linker_factory import \
            create_unified_cache_linker
        config = {"linker": "HostkvLinker", "linker_module_path": "hostkv.sglang.linker",
                  "linker_extra_config": dict(options, tp_rank=rank, tp_size=tp)}
        previous = set_memory(enable_unified_cache_external_linker=True,
                              unified_cache_external_linker_config=config)
        try:
            self.linker = create_unified_cache_linker(_ServerArgs(model), params,
                                                      components={ComponentType.FULL})
        finally:
            set_memory(**previous)
        self.kv.register_layer_transfer_counter(self.linker.layer_done_counter)


class Engine:
    """One SGLang engine: tp ranks, a device prefix cache of whole pages."""

    def __init__(self, target, model="org/llama-test", layers=4, pages=64, page_size=4, tp=2,
                 extra=None, via="factory"):
        self.page_size, self.layers, self.tp = page_size, layers, tp
        self.ranks = [Rank(target, model, layers, pages * page_size, page_size, r, tp, extra,
                           via)
                      for r in range(tp)]
        self.free = list(range(0, pages * page_size, page_size))  # page-aligned slots
        self.device = {}       # page hash -> first slot of its page (the "tree")
        self.offloads = 0      # offload() calls made
        self.stored = 0        # offload results True on every rank
        self.offload_failures = 0
        self.loaded_pages = 0  # pages loaded and checked
        self.rows_checked = 0

    # -- bytes ------------------------------------------------------------------

    def expected(self, rank, plane, layer, page_hash):
        digest = hashlib.sha256(f"{page_hash}/{rank}/{plane}/{layer}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        return torch.randn((self.page_size, 2, 8), generator=gen).to(torch.bfloat16)

    def _planes(self, r):
        pool = self.ranks[r].pool
        return [pool.k_buffer, pool.v_buffer]

    def _write_page(self, page_hash, slot):
        for r in range(self.tp):
            for p, plane in enumerate(self._planes(r)):
                for layer in range(self.layers):
                    plane[layer][slot:slot + self.page_size] = self.expected(r, p, layer,
                                                                             page_hash)

    def _check_layer(self, r, layer, pages):
        kv = self.ranks[r].kv
        k, v = kv.get_key_buffer(layer), kv.get_value_buffer(layer)  # waits for the layer
        for page_hash, slot in pages:
            for p, buf in enumerate((k, v)):
                got = buf[slot:slot + self.page_size]
                want = self.expected(r, p, layer, page_hash)
                if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
                    raise AssertionError(f"rank {r} layer {layer} plane {p}: page {page_hash[:8]}"
                                         f" at slot {slot} is not the bytes offloaded")
                self.rows_checked += 1

    # -- one request --------------------------------------------------------------

    def hashes(self, tokens):
        from sglang.srt.mem_cache.utils import get_storage_hash_str
        return get_storage_hash_str(tokens, None, page_size=self.page_size)

    def match(self, rid, tokens):
        """(device pages, hit pages of the tail) as the wrapper's match."""
        from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
        hashes = self.hashes(tokens)
        dev = 0
        while dev < len(hashes) and hashes[dev] in self.device:
            dev += 1
        tail = hashes[dev:]
        if not tail:
            return dev, [], 0
        num = len(tail)
        mask = torch.ones(num + 1, dtype=torch.int)
        for rank in self.ranks:
            sets = rank.linker.lookup(rid, [PoolTransfer(name=PoolName.KV, keys=list(tail))])
            local = torch.zeros(num + 1, dtype=torch.int)
            for n in sets:
                if 0 < n <= num:
                    local[n] = 1
            mask = torch.minimum(mask, local)  # all_reduce(MIN)
        common = mask.nonzero()
        hit = int(common[-1].item()) if common.numel() else 0
        return dev, tail, hit

    def request(self, rid, tokens, trim=None, abort=False):
        """Runs one request; returns the tail pages loaded from hostkvd."""
        from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
        dev, tail, hit = self.match(rid, tokens)
        if trim is not None:
            hit = min(hit, trim)  # the tree adopted fewer pages than found
        loaded = []
        if hit:
            slots = [self.free.pop(0) for _ in range(hit)]
            device_indices = torch.tensor([s + i for s in slots for i in range(self.page_size)],
                                          dtype=torch.int64)
            for rank in self.ranks:
                assert rank.linker.load(rid, [PoolTransfer(name=PoolName.KV,
                                                           keys=list(tail[:hit]),
                                                           device_indices=device_indices)])
            if abort:
                # release_aborted_request: a False leaves the load queued and
                # its nodes locked (the slots stay the tree's until it lands).
                cancelled = [rank.linker.cancel_queued_load(rid) for rank in self.ranks]
                if any(cancelled):
                    self.free[:0] = slots
                else:
                    for page_hash, slot in zip(tail[:hit], slots):
                        self.device[page_hash] = slot
                return cancelled
            loaded = list(zip(tail[:hit], slots))
            indices = [rank.linker.start_layer_wise_loading() for rank in self.ranks]
            for r, rank in enumerate(self.ranks):
                rank.linker.layer_done_counter.set_consumer(indices[r])
                for layer in range(self.layers):  # the forward pass, layer by layer
                    self._check_layer(r, layer, loaded)
                rank.linker.layer_done_counter.set_consumer(-1)
            for page_hash, slot in loaded:
                self.device[page_hash] = slot
            self.loaded_pages += hit
        # (A lookup no load follows gets no call: SGLang has none to make.)
        # Compute the rest, insert, write through.
        new = []
        for page_hash in tail[hit:]:
            slot = self.free.pop(0)
            self._write_page(page_hash, slot)
            self.device[page_hash] = slot
            new.append((page_hash, slot))
        if new:
            device_indices = torch.tensor([s + i for _, s in new for i in range(self.page_size)],
                                          dtype=torch.int64)
            for rank in self.ranks:
                assert rank.linker.offload([PoolTransfer(name=PoolName.KV,
                                                         keys=[h for h, _ in new],
                                                         device_indices=device_indices)])
            self.offloads += 1
        self.poll()
        return loaded

    def poll(self, wait_offloads=False):
        """check_hicache_events: completions taken by the MIN over ranks."""
        import time  # pylint: disable=import-outside-toplevel
        deadline = time.monotonic() + 30
        while True:
            n = min(rank.linker.num_completed_loads() for rank in self.ranks)
            for rank in self.ranks:
                for _ in range(n):
                    rank.linker.pop_completed_load()
            m = min(rank.linker.num_completed_offloads() for rank in self.ranks)
            for _ in range(m):
                results = [rank.linker.pop_completed_offload() for rank in self.ranks]
                if all(results):
                    self.stored += 1
                else:
                    self.offload_failures += 1
            if not wait_offloads or self.stored + self.offload_failures >= self.offloads:
                return
            if time.monotonic() > deadline:
                raise AssertionError("offloads did not complete in 30 s")
            time.sleep(0.005)

    def forget_device(self):
        """Drops the device prefix cache (as a restarted engine starts)."""
        self.free = sorted(set(self.free) | set(self.device.values()))
        self.device.clear()
        for rank in self.ranks:
            rank.pool.kv.view(torch.uint8).fill_(NOISE)

    def close(self):
        for rank in self.ranks:
            rank.linker.close()


def referenced_pages(daemon, pool):
    """Pages of `pool` some session holds a reference on (hostkvd's stats)."""
    import hostkv  # pylint: disable=import-outside-toplevel
    with hostkv.Client(daemon.target, "probe") as c:
        return c.get_pool_stats(pool).pools[0].cache.referenced_pages


def prompt(pages, page_size=4, first=100):
    return list(range(first, first + pages * page_size))


def standin():
    return sglang_standin.as_sglang(reimport=("hostkv.sglang.linker", "hostkv.sglang.plugin"))


def load_hostkv_plugin():
    """SGLang's load_plugins() with hostkv's entry point as pyproject.toml
    declares it (the test tree does not pip-install the package; the
    installed metadata is checked in test_sglang_install.py)."""
    import importlib.metadata  # pylint: disable=import-outside-toplevel
    from sglang.srt.mem_cache import registry
    from sglang.srt.plugins import GROUP, load_plugins
    registry._forget("hostkv")  # pylint: disable=protected-access
    load_plugins([importlib.metadata.EntryPoint(
        name="hostkv", value="hostkv.sglang.plugin:register", group=GROUP)])
