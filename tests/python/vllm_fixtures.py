"""vLLM-shaped instances on hostkvd for the hostkv.vllm tests: configs
and FlashAttention KV caches as vLLM builds them (per layer (2, num_blocks,
block_size, num_kv_heads, head_size), in shared memory so that the CPU
backend can map them), the spec built per process role as vLLM's
OffloadingConnector does (vllm_standin/drive.py, modelled on
vllm-project/vllm 0072b0b7443bdddf17824c78d4feae8e1fc12fb4), and the
connector's call order."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "vllm_standin"))

import torch  # noqa: E402

import hostkv.torch as hkt  # noqa: E402
from vllm.config import (CacheConfig, KVEventsConfig, KVTransferConfig,  # noqa: E402
                         ModelConfig, ParallelConfig, VllmConfig)
from vllm.v1.core.kv_cache_utils import request_block_hashes  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, KVCacheTensor)

import drive  # noqa: E402  (vllm_standin/drive.py)

BLOCK = 16


def configs(target, model="org/llama-test", tp=1, rank=0, num_blocks=32, layers=2,
            heads=2, head_size=32, capacity_bytes=1 << 20, events=True, extra=None,
            dtype=torch.float16):
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=heads, head_size=head_size,
                             dtype=dtype)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    kcc = KVCacheConfig(num_blocks, [KVCacheTensor(num_blocks * spec.page_size_bytes, [n])
                                     for n in names], [KVCacheGroupSpec(names, spec)])
    options = {"spec_name": "HostkvOffloadingSpec", "spec_module_path": "hostkv.vllm",
               "hostkv_target": target}
    if capacity_bytes is not None:
        options["cpu_bytes_to_use"] = capacity_bytes
    options.update(extra or {})
    vc = VllmConfig(model_config=ModelConfig(model=model, dtype=dtype),
                    cache_config=CacheConfig(block_size=BLOCK),
                    parallel_config=ParallelConfig(tensor_parallel_size=tp, rank=rank),
                    kv_transfer_config=KVTransferConfig(kv_connector_extra_config=options),
                    kv_events_config=KVEventsConfig(enable_kv_cache_events=events))
    return vc, kcc


def flash_attn_caches(kcc, seed):
    """layer -> (2, num_blocks, block_size, heads, head_size) in shared
    memory, random."""
    gen = torch.Generator().manual_seed(seed)
    caches = {}
    for group in kcc.kv_cache_groups:
        s = group.kv_cache_spec
        for name in group.layer_names:
            t = hkt.shm_tensor((2, kcc.num_blocks, s.block_size, s.num_kv_heads, s.head_size),
                               s.dtype)
            t.copy_(torch.randn(t.shape, generator=gen).to(s.dtype))
            caches[name] = t
    return caches


def block_bytes(caches, block_ids):
    """The bytes of the given GPU blocks, K and V of every layer, as one
    tensor, one row per block (what must match after a round trip)."""
    return torch.stack([torch.cat([caches[n][kv, b].reshape(-1).view(torch.uint8)
                                   for n in sorted(caches) for kv in (0, 1)])
                        for b in block_ids])


class Instance:
    """One vLLM instance: a scheduler-side spec and manager, and one worker
    per rank, each with its own spec and KV caches (seed + rank)."""

    def __init__(self, target, seed, tp=1, era="v0.14+", **kw):
        self.vc, self.kcc = configs(target, tp=tp, **kw)
        self.sched = drive.SchedulerSide(drive.create_spec(self.vc, self.kcc, era=era))
        self.workers, self.caches = [], []
        for rank in range(tp):
            vc, kcc = configs(target, tp=tp, rank=rank, **kw)
            caches = flash_attn_caches(kcc, seed * 100 + rank)
            spec = drive.create_spec(vc, kcc, era=era)
            self.workers.append(drive.WorkerSide(spec, drive.canonicalize(caches, kcc)))
            self.caches.append(caches)

    def store(self, hashes, gpu_ids, start=0):
        out, transfer = self.sched.prepare_store(hashes, gpu_ids, start)
        if transfer is None:
            return out, []
        jobs = [w.submit(transfer) for w in self.workers]
        results = [w.wait([j])[j] for w, j in zip(self.workers, jobs)]
        ok = all(r is not None and r.success for r in results)
        self.sched.complete_store(out.block_hashes_to_store, ok)
        return out, results

    def load(self, hashes, gpu_ids, start=0):
        hits, transfer = self.sched.lookup_and_prepare_load(hashes, gpu_ids, start)
        if transfer is None:
            return hits, []
        jobs = [w.submit(transfer) for w in self.workers]
        results = [w.wait([j])[j] if j is not None else None
                   for w, j in zip(self.workers, jobs)]
        self.sched.complete_load(list(hashes)[start:start + hits])
        return hits, results

    def close(self):
        for w in self.workers:
            w.shutdown()
        self.sched.manager.close()


def prompt_hashes(n_blocks, first_token=1000):
    tokens = list(range(first_token, first_token + BLOCK * n_blocks))
    return request_block_hashes(tokens, BLOCK)
