"""Drives an OffloadingSpec in the call order of vLLM's OffloadingConnector
(vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py and
offloading/{scheduler,worker}.py at vllm-project/vllm
0072b0b7443bdddf17824c78d4feae8e1fc12fb4, v0.19-v0.20 era; worker side
cross-checked with offloading/worker.py at
0078e9d2b020be709d7d756877106fd1015ea4f4). Single KV cache group, as
vLLM's CPU handlers require.

Scheduler process (SchedulerSide, one manager per engine):
  load:  touch(all request hashes) -> lookup(hashes from the first block
         not computed on GPU) -> prepare_load(hit hashes) -> [workers load]
         -> complete_load(the SET of the request's loaded hashes) when the
         worker reports the job done;
  store: prepare_store(new full-block hashes) -> touch(hashes so far) ->
         [workers store block_hashes_to_store] -> complete_store(the SET of
         the request's stored hashes, accumulated over its steps) when done
         (also when the request is preempted);
  every step: take_events() -> BlockStored / BlockRemoved.
Worker process (WorkerSide, one per rank): get_handlers(CanonicalKVCaches)
once, handlers registered by (src medium, dst medium); per job
transfer_async(job_id, (src, dst)) -> get_finished() polled each step;
wait(job_ids) where vLLM must fence (preemption).

create_spec loads a spec as vLLM's factory does, with the constructor of
either era: "v0.14+" spec_cls(vllm_config, kv_cache_config), "v0.11"
spec_cls(vllm_config).
"""
import itertools
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import torch  # noqa: E402

from vllm.distributed.kv_events import BlockRemoved, BlockStored  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402
from vllm.v1.kv_offload.mediums import GPULoadStoreSpec  # noqa: E402
from vllm.v1.kv_offload.spec import (  # noqa: E402
    CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor)
from vllm.v1.kv_offload.worker.worker import OffloadingWorker  # noqa: E402

ERAS = ("v0.14+", "v0.11")


def create_spec(vllm_config, kv_cache_config=None, era="v0.14+"):
    """Loads spec_name / spec_module_path from kv_connector_extra_config
    (ValueError, AttributeError, AssertionError as vLLM's factory) and
    constructs it the way the given vLLM era does."""
    spec_cls = OffloadingSpecFactory.get_spec_class(vllm_config)
    if era == "v0.14+":
        return spec_cls(vllm_config, kv_cache_config)
    if era == "v0.11":
        return spec_cls(vllm_config)
    raise ValueError(f"era must be one of {ERAS}")


def make_flash_attn_kv_caches(kv_cache_config, device="cpu", seed=0):
    """layer name -> tensor (2, num_blocks, block_size, num_kv_heads,
    head_size): FlashAttention's per-layer layout, filled with random data."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    caches = {}
    for group in kv_cache_config.kv_cache_groups:
        s = group.kv_cache_spec
        shape = (2, kv_cache_config.num_blocks, s.block_size, s.num_kv_heads, s.head_size)
        for name in group.layer_names:
            caches[name] = torch.randn(shape, generator=gen).to(s.dtype).to(device)
    return caches


def canonicalize(kv_caches, kv_cache_config):
    """CanonicalKVCaches of FlashAttention-layout caches: each layer's K and
    V halves as int8 views (num_blocks, page bytes of one half)."""
    tensors, groups = [], []
    for group in kv_cache_config.kv_cache_groups:
        refs = []
        for name in group.layer_names:
            cache = kv_caches[name]
            for half in cache.unbind(0):
                flat = half.reshape(half.shape[0], -1).view(torch.int8)
                page = flat.shape[1]
                tensors.append(CanonicalKVCacheTensor(flat, page))
                refs.append(CanonicalKVCacheRef(len(tensors) - 1, page))
        groups.append(refs)
    return CanonicalKVCaches(tensors=tensors, group_data_refs=groups)


class SchedulerSide:
    """The scheduler half of the connector around spec.get_manager()."""

    def __init__(self, spec):
        self.spec = spec
        self.manager = spec.get_manager()
        self.factor = spec.block_size_factor

    def _gpu_ids(self, gpu_block_ids, offloaded_indices):
        return [gpu_block_ids[i * self.factor + j]
                for i in offloaded_indices for j in range(self.factor)]

    def lookup_and_prepare_load(self, block_hashes, gpu_block_ids, start=0):
        """Returns (hits, transfer spec or None); hits None: retry later."""
        block_hashes = list(block_hashes)
        self.manager.touch(block_hashes)
        hits = self.manager.lookup(iter(block_hashes[start:]))
        if not hits:
            return hits, None
        hit_hashes = block_hashes[start:start + hits]
        src = self.manager.prepare_load(hit_hashes)
        ids = self._gpu_ids(gpu_block_ids, range(start, start + hits))
        dst = GPULoadStoreSpec(ids, group_sizes=(len(ids),),
                               block_indices=(start * self.factor,))
        return hits, (src, dst)

    def complete_load(self, block_hashes):
        # As update_connector_output: the SET of the request's loaded hashes
        # (_reqs_being_loaded), in no order.
        self.manager.complete_load(set(block_hashes))

    def prepare_store(self, block_hashes, gpu_block_ids, start=0):
        """Returns (PrepareStoreOutput or None, transfer spec or None)."""
        block_hashes = list(block_hashes)
        new_hashes = block_hashes[start:]
        out = self.manager.prepare_store(new_hashes)
        if out is None or not out.block_hashes_to_store:
            return out, None
        self.manager.touch(block_hashes)
        to_store = set(out.block_hashes_to_store)
        indices = [start + i for i, h in enumerate(new_hashes) if h in to_store]
        ids = self._gpu_ids(gpu_block_ids, indices)
        return out, (GPULoadStoreSpec(ids, group_sizes=(len(ids),)), out.store_spec)

    def complete_store(self, block_hashes, success=True):
        # As update_connector_output / a preemption: the SET of the
        # request's stored hashes (_reqs_being_stored, grown with |= over its
        # steps), in no order.
        self.manager.complete_store(set(block_hashes), success)

    def take_events(self):
        events = []
        for e in self.manager.take_events():
            if e.removed:
                events.append(BlockRemoved(block_hashes=e.block_hashes, medium=e.medium))
            else:
                events.append(BlockStored(block_hashes=e.block_hashes, parent_block_hash=None,
                                          token_ids=[], block_size=e.block_size,
                                          medium=e.medium))
        return events


class WorkerSide:
    """The worker half: one OffloadingWorker over spec.get_handlers()."""

    def __init__(self, spec, canonical_kv_caches):
        self.worker = OffloadingWorker()
        for src_cls, dst_cls, handler in spec.get_handlers(canonical_kv_caches):
            self.worker.register_handler(src_cls, dst_cls, handler)
        self._job_ids = itertools.count(1)
        self.results = {}

    def submit(self, transfer_spec):
        """Returns the job id, or None if the handler refused the job."""
        job_id = next(self._job_ids)
        return job_id if self.worker.transfer_async(job_id, transfer_spec) else None

    def poll(self):
        done = self.worker.get_finished()
        for r in done:
            assert r.job_id not in self.results, f"job {r.job_id} reported twice"
            self.results[r.job_id] = r
        return done

    def wait(self, job_ids):
        self.worker.wait(set(job_ids))
        self.poll()
        return {j: self.results.get(j) for j in job_ids}

    def shutdown(self):
        self.worker.shutdown()


def store_blocks(sched, worker, block_hashes, gpu_block_ids, start=0):
    """prepare_store -> transfer -> complete_store. Returns the
    PrepareStoreOutput (None: could not store) and the job's result."""
    out, transfer = sched.prepare_store(block_hashes, gpu_block_ids, start)
    if transfer is None:
        return out, None
    job = worker.submit(transfer)
    result = worker.wait([job])[job] if job is not None else None
    sched.complete_store(out.block_hashes_to_store, bool(result and result.success))
    return out, result


def load_blocks(sched, worker, block_hashes, gpu_block_ids, start=0):
    """touch -> lookup -> prepare_load -> transfer -> complete_load.
    Returns (hits, result)."""
    hits, transfer = sched.lookup_and_prepare_load(block_hashes, gpu_block_ids, start)
    if transfer is None:
        return hits, None
    job = worker.submit(transfer)
    result = worker.wait([job])[job] if job is not None else None
    sched.complete_load(list(block_hashes)[start:start + hits])
    return hits, result
