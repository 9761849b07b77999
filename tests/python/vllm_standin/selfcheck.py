"""Self-check of the vLLM stand-in (plain python3, no pytest): a trivial
in-memory OffloadingSpec, defined here, is loaded through the stand-in's
factory by spec_name / spec_module_path and driven in the connector's call
order (drive.py) with torch tensors shaped as vLLM's FlashAttention KV
caches. Run: /usr/bin/python3 tests/python/vllm_standin/selfcheck.py
"""
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import drive  # noqa: E402
from vllm.config import CacheConfig, KVTransferConfig, VllmConfig  # noqa: E402
from vllm.v1.core.kv_cache_utils import request_block_hashes  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor)
from vllm.v1.kv_offload.abstract import (  # noqa: E402
    OffloadingEvent, OffloadingManager, PrepareStoreOutput)
from vllm.v1.kv_offload.mediums import CPULoadStoreSpec, GPULoadStoreSpec  # noqa: E402
from vllm.v1.kv_offload.spec import OffloadingSpec  # noqa: E402
from vllm.v1.kv_offload.worker.worker import OffloadingHandler, TransferResult  # noqa: E402

STORE = {}  # "host memory" shared by every dummy spec of this process


class DummyManager(OffloadingManager):
    """LRU over `capacity` CPU blocks; refs pin blocks during loads/stores."""

    def __init__(self, capacity, block_size):
        self.capacity, self.block_size = capacity, block_size
        self.blocks = OrderedDict()  # hash -> [cpu block id, refs, ready]
        self.free = list(range(capacity))
        self.events = []

    def lookup(self, block_hashes):
        n = 0
        for h in block_hashes:
            b = self.blocks.get(h)
            if b is None or not b[2]:
                break
            n += 1
        return n

    def prepare_load(self, block_hashes):
        ids = []
        for h in block_hashes:
            b = self.blocks[h]
            assert b[2], "block not ready"
            b[1] += 1
            ids.append(b[0])
        return CPULoadStoreSpec(ids)

    def touch(self, block_hashes):
        for h in block_hashes:
            if h in self.blocks:
                self.blocks.move_to_end(h)

    def complete_load(self, block_hashes):
        for h in block_hashes:
            self.blocks[h][1] -= 1

    def prepare_store(self, block_hashes):
        block_hashes = list(block_hashes)
        new = [h for h in block_hashes if h not in self.blocks]
        evictable = [h for h, b in self.blocks.items() if b[1] == 0 and b[2]
                     and h not in block_hashes]
        need = len(new) - len(self.free)
        if need > len(evictable):
            return None
        evicted = evictable[:max(need, 0)]
        for h in evicted:
            self.free.append(self.blocks.pop(h)[0])
        if evicted:
            self.events.append(OffloadingEvent(evicted, self.block_size, "CPU", True))
        ids = []
        for h in new:
            self.blocks[h] = [self.free.pop(0), 1, False]
            ids.append(self.blocks[h][0])
        return PrepareStoreOutput(new, CPULoadStoreSpec(ids), evicted)

    def complete_store(self, block_hashes, success=True):
        stored = []
        for h in block_hashes:
            b = self.blocks.get(h)
            if b is None or b[2]:
                continue
            if success:
                b[1], b[2] = 0, True
                stored.append(h)
            else:
                self.free.append(self.blocks.pop(h)[0])
        if stored:
            self.events.append(OffloadingEvent(stored, self.block_size, "CPU", False))

    def take_events(self):
        events, self.events = self.events, []
        return events


class DummyHandler(OffloadingHandler):
    """Copies whole blocks between the canonical tensors and CPU tensors
    (synchronously; results are reported by get_finished)."""

    def __init__(self, gpu, cpu, to_cpu):
        self.gpu, self.cpu, self.to_cpu, self.done = gpu, cpu, to_cpu, []

    def transfer_async(self, job_id, spec):
        src, dst = spec
        gpu_spec, cpu_spec = (src, dst) if self.to_cpu else (dst, src)
        g = torch.from_numpy(gpu_spec.block_ids)
        c = torch.from_numpy(cpu_spec.block_ids)
        if len(g) != len(c):
            return False
        size = 0
        for gt, ct in zip(self.gpu, self.cpu):
            if self.to_cpu:
                ct.index_copy_(0, c, gt.index_select(0, g))
            else:
                gt.index_copy_(0, g, ct.index_select(0, c))
            size += len(g) * gt.shape[1]
        self.done.append(TransferResult(job_id, True, size, 0.0,
                                        ("GPU", "CPU") if self.to_cpu else ("CPU", "GPU")))
        return True

    def get_finished(self):
        done, self.done = self.done, []
        return done

    def wait(self, job_ids):
        return


class DummySpec(OffloadingSpec):
    """Accepts both constructor signatures, as a spec for several vLLM
    versions must."""

    def __init__(self, vllm_config, kv_cache_config=None):
        self.legacy = kv_cache_config is None
        if self.legacy:  # v0.11: base class took (vllm_config)
            self.vllm_config, self.kv_cache_config = vllm_config, None
            self.extra_config = vllm_config.kv_transfer_config.kv_connector_extra_config
            self.block_size_factor = 1
        else:
            super().__init__(vllm_config, kv_cache_config)
        self.capacity = int(self.extra_config.get("capacity_blocks", 8))
        self.name = self.extra_config.get("namespace", "default")

    def get_manager(self):
        return DummyManager(self.capacity, self.vllm_config.cache_config.block_size)

    def get_handlers(self, kv_caches):
        gpu = [t.tensor for t in kv_caches.tensors]
        cpu = STORE.setdefault(self.name, [torch.zeros((self.capacity, t.shape[1]),
                                                       dtype=torch.int8) for t in gpu])
        yield GPULoadStoreSpec, CPULoadStoreSpec, DummyHandler(gpu, cpu, True)
        yield CPULoadStoreSpec, GPULoadStoreSpec, DummyHandler(gpu, cpu, False)


class NotASpec:
    pass


def configs(capacity=8, spec_name="DummySpec", module=__name__):
    spec = FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype=torch.float16)
    layers = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    num_blocks = 32
    kcc = KVCacheConfig(num_blocks, [KVCacheTensor(num_blocks * spec.page_size_bytes, [n])
                                     for n in layers], [KVCacheGroupSpec(layers, spec)])
    extra = {"spec_name": spec_name, "spec_module_path": module,
             "capacity_blocks": capacity, "namespace": "ns"}
    vc = VllmConfig(cache_config=CacheConfig(block_size=16),
                    kv_transfer_config=KVTransferConfig(kv_connector_extra_config=extra))
    return vc, kcc


def instance(seed, capacity=8, era="v0.14+"):
    vc, kcc = configs(capacity)
    sched_spec = drive.create_spec(vc, kcc, era=era)
    worker_spec = drive.create_spec(vc, kcc, era=era)  # the worker's own copy
    caches = drive.make_flash_attn_kv_caches(kcc, seed=seed)
    sched = drive.SchedulerSide(sched_spec)
    worker = drive.WorkerSide(worker_spec, drive.canonicalize(caches, kcc))
    return sched, worker, caches


def expect(exc, fn):
    try:
        fn()
    except exc:
        return
    raise AssertionError(f"expected {exc.__name__}")


def main():
    os.environ.setdefault("PYTHONHASHSEED", "0")
    tokens = list(range(1000, 1000 + 16 * 4))
    hashes = request_block_hashes(tokens, 16)
    assert len(hashes) == 4 and all(isinstance(h, bytes) for h in hashes)
    assert hashes == request_block_hashes(tokens, 16)  # same seed, same chain

    sched_a, worker_a, caches_a = instance(seed=1)
    assert isinstance(sched_a.spec, DummySpec) and not sched_a.spec.legacy
    first = drive.canonicalize(caches_a, configs()[1]).tensors[0]
    assert first.tensor.dtype == torch.int8 and first.tensor.shape == (32, 16 * 4 * 64 * 2)

    out, result = drive.store_blocks(sched_a, worker_a, hashes, [3, 5, 7, 9])
    assert out.block_hashes_to_store == hashes and out.block_hashes_evicted == []
    assert result.success and result.transfer_size == 4 * 2 * 2 * 16 * 4 * 64 * 2
    events = sched_a.take_events()
    assert [type(e).__name__ for e in events] == ["BlockStored"]
    out, transfer = sched_a.prepare_store(hashes, [3, 5, 7, 9])
    assert out.block_hashes_to_store == [] and transfer is None  # already stored

    # a second "instance" (other KV contents) loads A's blocks byte-exact
    sched_b, worker_b, caches_b = instance(seed=2)
    sched_b.manager.blocks = sched_a.manager.blocks  # share the index, as hostkvd would
    hits, result = drive.load_blocks(sched_b, worker_b, hashes, [10, 11, 12, 13])
    assert hits == 4 and result.success
    for name in caches_a:
        assert torch.equal(caches_a[name][:, [3, 5, 7, 9]], caches_b[name][:, [10, 11, 12, 13]])
    assert all(b[1] == 0 for b in sched_a.manager.blocks.values())  # refs released

    # partial hit: lookup counts from the first block not on the GPU
    other = request_block_hashes(list(range(5000, 5000 + 64)), 16)
    hits, transfer = sched_b.lookup_and_prepare_load(hashes[:2] + other[2:], [0, 1, 2, 3])
    assert hits == 2 and transfer[1].block_ids.tolist() == [0, 1]
    sched_b.complete_load(hashes[:2])

    # eviction under pressure reports the evicted hashes
    sched_c, worker_c, _ = instance(seed=3, capacity=4)
    drive.store_blocks(sched_c, worker_c, hashes, [0, 1, 2, 3])
    sched_c.take_events()
    out, _ = drive.store_blocks(sched_c, worker_c, other[:2], [4, 5])
    assert set(out.block_hashes_evicted) == set(hashes[:2]), out.block_hashes_evicted
    ev = sched_c.take_events()
    assert type(ev[0]).__name__ == "BlockRemoved" and set(ev[0].block_hashes) == set(hashes[:2])
    # a pinned (loading) store cannot be evicted: prepare_store answers None
    sched_c.lookup_and_prepare_load(hashes[2:] + [], [0, 1])
    for h in other[:2]:
        sched_c.manager.blocks[h][1] = 1
    assert sched_c.prepare_store(request_block_hashes(list(range(9000, 9016)), 16),
                                 [6])[0] is None

    # failed store frees the blocks
    sched_d, worker_d, _ = instance(seed=4)
    out, _ = sched_d.prepare_store(hashes[:1], [0])
    sched_d.complete_store(out.block_hashes_to_store, success=False)
    assert sched_d.manager.lookup(hashes[:1]) == 0

    # factory: old constructor, missing module, non-spec class
    legacy, _, _ = instance(seed=5, era="v0.11")
    assert legacy.spec.legacy
    vc, kcc = configs(spec_name="Nope", module=None)
    del vc.kv_transfer_config.kv_connector_extra_config["spec_module_path"]
    expect(ValueError, lambda: drive.create_spec(vc, kcc))
    vc, kcc = configs(spec_name="NotASpec")
    expect(AssertionError, lambda: drive.create_spec(vc, kcc))
    vc, kcc = configs(spec_name="Missing")
    expect(AttributeError, lambda: drive.create_spec(vc, kcc))
    worker_a.shutdown()
    print("vllm stand-in selfcheck: OK")


if __name__ == "__main__":
    main()
