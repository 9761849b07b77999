"""The torch_e2e check's vLLM engines: hostkv.vllm's HostkvOffloadingSpec
over CUDA KV caches shaped as vLLM's FlashAttention backend makes them
(per layer (2, num_blocks, block_size, heads, head_size), bf16), driven in
the OffloadingConnector's call order by the vLLM stand-in
(vllm_standin/drive.py, modelled on vllm-project/vllm
0072b0b7443bdddf17824c78d4feae8e1fc12fb4), in two processes:

  vllm-a  writes the KV of 8 blocks late on its compute stream
          (torch.cuda._sleep first), then stores them at once, no host
          sync: the store must wait for the KV (the handler's "KV written"
          mark), else it saves the zeros that were there. Saves the bytes
          it expects to WORKDIR/vllm_expected.pt.
  vllm-b  another instance (another process, session and KV cache):
          looks the blocks up, loads them into other block ids, compares
          the bytes with A's.
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.join(HERE, "vllm_standin"),
             os.path.join(HERE, "..", "python", "vllm_standin")):
    if os.path.isdir(path):
        sys.path.insert(0, path)
        break
os.environ.setdefault("PYTHONHASHSEED", "0")

import drive  # noqa: E402
from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig,  # noqa: E402
                         ParallelConfig, VllmConfig)
from vllm.v1.core.kv_cache_utils import request_block_hashes  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, KVCacheTensor)

BLOCK, LAYERS, HEADS, HEAD, NUM_BLOCKS = 16, 4, 8, 128, 64
STORED = [3, 9, 10, 11, 20, 21, 40, 63]
LOADED = [0, 1, 2, 30, 31, 32, 50, 51]


def _instance(target):
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                             dtype=torch.bfloat16)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    kcc = KVCacheConfig(NUM_BLOCKS, [KVCacheTensor(NUM_BLOCKS * spec.page_size_bytes, [n])
                                     for n in names], [KVCacheGroupSpec(names, spec)])
    vc = VllmConfig(model_config=ModelConfig(model="e2e/vllm-cuda", dtype=torch.bfloat16),
                    cache_config=CacheConfig(block_size=BLOCK),
                    parallel_config=ParallelConfig(),
                    kv_transfer_config=KVTransferConfig(kv_connector_extra_config={
                        "spec_name": "HostkvOffloadingSpec", "spec_module_path": "hostkv.vllm",
                        "hostkv_target": target, "cpu_bytes_to_use": 256 << 20}))
    caches = {n: torch.zeros((2, NUM_BLOCKS, BLOCK, HEADS, HEAD), dtype=torch.bfloat16,
                             device="cuda") for n in names}
    sched = drive.SchedulerSide(drive.create_spec(vc, kcc))
    worker = drive.WorkerSide(drive.create_spec(vc, kcc), drive.canonicalize(caches, kcc))
    return sched, worker, caches


def _blocks(caches, ids):
    return torch.stack([torch.cat([caches[n][kv, b].reshape(-1).view(torch.uint8)
                                   for n in sorted(caches) for kv in (0, 1)]) for b in ids])


def run(role, target, workdir):
    hashes = request_block_hashes(list(range(7, 7 + BLOCK * len(STORED))), BLOCK)
    sched, worker, caches = _instance(target)
    expected_file = os.path.join(workdir, "vllm_expected.pt")
    if role == "vllm-a":
        torch.cuda._sleep(50_000_000)  # the forward pass's KV lands late
        for t in caches.values():
            t[:, STORED].normal_()
        out, transfer = sched.prepare_store(hashes, STORED)
        job = worker.submit(transfer)  # no host sync before it
        if job is None:
            raise RuntimeError("the store job was refused")
        expected = _blocks(caches, STORED).cpu()  # syncs the stream
        result = worker.wait([job])[job]
        if result is None or not result.success:
            raise RuntimeError(f"the store job failed: {result}")
        sched.complete_store(out.block_hashes_to_store, True)
        torch.save(expected, expected_file)
        print(f"vllm-a: stored {len(STORED)} blocks ({expected.numel()} bytes)", flush=True)
    else:
        expected = torch.load(expected_file)
        hits, transfer = sched.lookup_and_prepare_load(hashes, LOADED)
        if hits != len(STORED):
            raise RuntimeError(f"instance B found {hits} of {len(STORED)} blocks")
        job = worker.submit(transfer)
        result = worker.wait([job])[job]
        if result is None or not result.success:
            raise RuntimeError(f"the load job failed: {result}")
        sched.complete_load(hashes)
        got = _blocks(caches, LOADED).cpu()
        if not torch.equal(got, expected):
            bad = [i for i in range(len(LOADED)) if not torch.equal(got[i], expected[i])]
            raise RuntimeError(f"vLLM blocks {bad} differ after store and load")
        print(f"vllm: {len(STORED)} blocks of {expected.shape[1]} bytes stored by one "
              "instance and loaded byte-exact by another", flush=True)
    worker.shutdown()
    sched.manager.close()
    return 0
