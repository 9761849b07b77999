"""A hybrid sliding-window SGLang engine in miniature driving an external
linker, in the order of the wrapper of unified_cache_linker.py @03205d15
(id 71431584660) with main's SWA component
(unified_cache/components/swa_component.py @01636dc7, id 60260318272,
build_external_linker_transfer / update_external_linker_load):

  match      LOOKUP transfers [PoolTransfer(KV, keys=the tail's page
             hashes), PoolTransfer(SWA, keys=the last window_pages of them,
             hit_policy=TRAILING_PAGES)], lookup(rid, ...) per rank, the
             sets intersected over ranks (MIN of a 0/1 mask);
  load_back  KV slots for the hit pages; SWA slots (the window pool's own
             index space, its allocator) for the last window_pages of them:
             [KV(keys, device_indices), SWA(keys=hit tail[-window:],
             device_indices=SWA slots)], load(rid, ...) per rank;
  forward    per global layer the device pool's getter (SWAKVPool waits on
             the counter with the global id), where the driver checks the
             layer's rows: a full layer's for every hit page, a window
             layer's for the window's pages;
  offload    per new node: [KV(keys, full slots), SWA(keys of its pages in
             the request's final window, their SWA slots, TRAILING_PAGES)];
             the window's pages out of the window are never stored (their
             SWA slots are freed as the window moves).
Device pools are hostkv.torch shm tensors (the CPU backend's device
memory); a page's bytes are a function of its hash, part, layer, plane and
rank.
"""
import hashlib

import torch

import sglang_model
import sglang_linker_driver as drv
from sglang_standin.srt.mem_cache import memory_pool as sp_memory_pool


class _Kv(sp_memory_pool.MHATokenToKVPool):
    def __init__(self, pool):
        self.k_buffer, self.v_buffer = pool.k_buffer, pool.v_buffer
        self.start_layer = 0


class _Params(drv._Params):  # pylint: disable=protected-access
    def __init__(self, kv, page_size, window_tokens):
        super().__init__(kv, page_size)
        self.sliding_window_size = window_tokens


# Global layer ids: full attention on 0 and 3, the window on the others.
FULL_LAYERS, WINDOW_LAYERS = [0, 3], [1, 2, 4, 5]
HEADS = {"kv": 2, "swa": 1}  # the window layers have fewer heads (other geometry)


class SwaRank:
    def __init__(self, target, model, slots, window_slots, page_size, rank, tp, window_tokens,
                 extra=None):
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_cache.linker_factory import \
            create_unified_cache_linker
        from sglang.srt.runtime_context import set_memory
        self.pools = {
            "kv": sglang_model.DevicePool("mha", len(FULL_LAYERS), slots, page_size,
                                          dtype=torch.bfloat16, head_num=HEADS["kv"],
                                          head_dim=8),
            "swa": sglang_model.DevicePool("mha", len(WINDOW_LAYERS), window_slots, page_size,
                                           dtype=torch.bfloat16, head_num=HEADS["swa"],
                                           head_dim=8)}
        for pool in self.pools.values():
            pool.kv.view(torch.uint8).fill_(drv.NOISE)
        self.kv = SWAKVPool(_Kv(self.pools["kv"]), _Kv(self.pools["swa"]), FULL_LAYERS,
                            WINDOW_LAYERS, page_size)
        options = dict({"hostkv_target": target, "hostkv_capacity_bytes": 32 << 20},
                       **(extra or {}))
        config = {"linker": "HostkvLinker", "linker_module_path": "hostkv.sglang.linker",
                  "linker_extra_config": dict(options, tp_rank=rank, tp_size=tp)}
        previous = set_memory(enable_unified_cache_external_linker=True,
                              unified_cache_external_linker_config=config)
        try:
            self.linker = create_unified_cache_linker(
                drv._ServerArgs(model),  # pylint: disable=protected-access
                _Params(self.kv, page_size, window_tokens),
                components={ComponentType.FULL, ComponentType.SWA})
        finally:
            set_memory(**previous)
        self.kv.register_layer_transfer_counter(self.linker.layer_done_counter)


class SwaEngine:
    """tp ranks of a hybrid model; window_tokens of sliding window."""

    def __init__(self, target, model="org/gemma-test", pages=64, window_pages=16, page_size=4,
                 window_tokens=10, tp=2, extra=None):
        self.page_size, self.tp = page_size, tp
        self.window = -(-window_tokens // page_size)  # window_pages of SGLang
        self.ranks = [SwaRank(target, model, pages * page_size, window_pages * page_size,
                              page_size, r, tp, window_tokens, extra) for r in range(tp)]
        self._all = {"kv": list(range(page_size, pages * page_size, page_size)),
                     "swa": list(range(page_size, window_pages * page_size, page_size))}
        self.free = {k: list(v) for k, v in self._all.items()}  # slot 0 is SGLang's dummy
        self.device = {}  # page hash -> full slot (the "tree")
        self.offloads = self.stored = self.offload_failures = 0
        self.rows_checked = {"kv": 0, "swa": 0}
        self.lookups = []  # per request: the ranks' lookup answers

    # -- bytes ------------------------------------------------------------------

    def expected(self, rank, part, plane, layer, page_hash):
        digest = hashlib.sha256(f"{page_hash}/{rank}/{part}/{plane}/{layer}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        return torch.randn((self.page_size, HEADS[part], 8), generator=gen).to(torch.bfloat16)

    def _write(self, part, page_hash, slot):
        for r, rank in enumerate(self.ranks):
            pool = rank.pools[part]
            for p, plane in enumerate((pool.k_buffer, pool.v_buffer)):
                for layer, buf in enumerate(plane):
                    buf[slot:slot + self.page_size] = self.expected(r, part, p, layer,
                                                                    page_hash)

    def _check(self, r, global_layer, pages):
        kv = self.ranks[r].kv
        part = "swa" if global_layer in WINDOW_LAYERS else "kv"
        local = kv.layers_mapping[global_layer][0]
        k = kv.get_key_buffer(global_layer)  # waits for the layer
        v = kv.get_value_buffer(global_layer)
        for page_hash, slot in pages[part]:
            for p, buf in enumerate((k, v)):
                got = buf[slot:slot + self.page_size]
                want = self.expected(r, part, p, local, page_hash)
                if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
                    raise AssertionError(f"rank {r} layer {global_layer} ({part}) plane {p}: "
                                         f"page {page_hash[:8]} at slot {slot} is not the "
                                         "bytes offloaded")
            self.rows_checked[part] += 1

    def _indices(self, slots):
        return torch.tensor([s + i for s in slots for i in range(self.page_size)],
                            dtype=torch.int64)

    # -- one request --------------------------------------------------------------

    def match(self, rid, tokens):
        from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer
        from sglang.srt.mem_cache.utils import get_storage_hash_str
        hashes = get_storage_hash_str(tokens, None, page_size=self.page_size)
        dev = 0
        while dev < len(hashes) and hashes[dev] in self.device:
            dev += 1
        tail = hashes[dev:]
        if not tail:
            return dev, [], 0
        mask = torch.ones(len(tail) + 1, dtype=torch.int)
        answers = []
        for rank in self.ranks:
            transfers = [PoolTransfer(name=PoolName.KV, keys=list(tail)),
                         PoolTransfer(name=PoolName.SWA, keys=list(tail[-self.window:]),
                                      hit_policy=PoolHitPolicy.TRAILING_PAGES)]
            sets = rank.linker.lookup(rid, transfers)
            answers.append(sorted(sets))
            local = torch.zeros(len(tail) + 1, dtype=torch.int)
            for n in sets:
                if 0 < n <= len(tail):
                    local[n] = 1
            mask = torch.minimum(mask, local)
        self.lookups.append(answers)
        common = mask.nonzero()
        return dev, tail, int(common[-1].item()) if common.numel() else 0

    def request(self, rid, tokens):
        """Runs one request: (KV pages loaded, window pages loaded)."""
        from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer
        dev, tail, hit = self.match(rid, tokens)
        loaded = {"kv": [], "swa": []}
        if hit:
            slots = [self.free["kv"].pop(0) for _ in range(hit)]
            window_keys = tail[:hit][-self.window:]
            window_slots = [self.free["swa"].pop(0) for _ in window_keys]
            for rank in self.ranks:
                assert rank.linker.load(rid, [
                    PoolTransfer(name=PoolName.KV, keys=list(tail[:hit]),
                                 device_indices=self._indices(slots)),
                    PoolTransfer(name=PoolName.SWA, keys=list(window_keys),
                                 device_indices=self._indices(window_slots),
                                 hit_policy=PoolHitPolicy.TRAILING_PAGES)])
            loaded = {"kv": list(zip(tail[:hit], slots)),
                      "swa": list(zip(window_keys, window_slots))}
            indices = [rank.linker.start_layer_wise_loading() for rank in self.ranks]
            for r, rank in enumerate(self.ranks):
                rank.linker.layer_done_counter.set_consumer(indices[r])
                for layer in range(len(FULL_LAYERS) + len(WINDOW_LAYERS)):
                    self._check(r, layer, loaded)
                rank.linker.layer_done_counter.set_consumer(-1)
            for page_hash, slot in loaded["kv"]:
                self.device[page_hash] = slot
        # Compute the rest; the window's pages at the end of the request are
        # the in-window SWA of the new node, offloaded with its KV.
        new = tail[hit:]
        in_window = [h for h in (tail[:hit] + new)[-self.window:] if h in new]
        full_slots, window_slots = [], []
        for page_hash in new:
            slot = self.free["kv"].pop(0)
            self._write("kv", page_hash, slot)
            self.device[page_hash] = slot
            full_slots.append(slot)
        for page_hash in in_window:
            slot = self.free["swa"].pop(0)
            self._write("swa", page_hash, slot)
            window_slots.append(slot)
        if new:
            for rank in self.ranks:
                transfers = [PoolTransfer(name=PoolName.KV, keys=list(new),
                                          device_indices=self._indices(full_slots))]
                if in_window:
                    transfers.append(PoolTransfer(
                        name=PoolName.SWA, keys=list(in_window),
                        device_indices=self._indices(window_slots),
                        hit_policy=PoolHitPolicy.TRAILING_PAGES))
                assert rank.linker.offload(transfers)
            self.offloads += 1
        self.poll(wait_offloads=bool(new))
        # The request ends: its window's SWA slots go back (the tree keeps
        # full KV; a window tombstoned), for the test's pool to last.
        self.free["swa"].extend(s for _, s in loaded["swa"])
        self.free["swa"].extend(window_slots)
        return loaded

    def poll(self, wait_offloads=False):
        drv.Engine.poll(self, wait_offloads)

    def forget_device(self):
        self.free = {k: list(v) for k, v in self._all.items()}
        self.device.clear()
        for rank in self.ranks:
            for pool in rank.pools.values():
                pool.kv.view(torch.uint8).fill_(drv.NOISE)

    def close(self):
        for rank in self.ranks:
            rank.linker.close()
