"""Models build_offloading_config in .../kv_connector/v1/offloading/config.py
(vllm-project/vllm 006f89ac, with group_id from the later form): the
OffloadingConfig every process builds from vLLM's config and KV cache config
before the factory creates the spec. blocks_per_chunk from extra_config
"blocks_per_chunk" or "block_size" (tokens; not both), else 1; events from
the KV events config; engine_id per DP rank."""
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,
                                       OffloadingGroupConfig, OffloadingModelConfig,
                                       OffloadingParallelConfig)


def build_offloading_config(vllm_config, kv_cache_config):
    extra = dict(vllm_config.extra_config)
    groups = kv_cache_config.kv_cache_groups
    block_sizes = [g.kv_cache_spec.block_size for g in groups]
    per_chunk = extra.get("blocks_per_chunk")
    tokens = extra.get("block_size")
    if per_chunk is not None and tokens is not None:
        raise ValueError("set blocks_per_chunk or block_size, not both")
    if tokens is not None:
        if len(set(block_sizes)) != 1 or int(tokens) % block_sizes[0]:
            raise ValueError("block_size must be a multiple of the single GPU block size")
        per_chunk = int(tokens) // block_sizes[0]
    per_chunk = int(per_chunk or 1)
    assert per_chunk > 0
    tokens_per_hash = vllm_config.hash_block_size
    for size in block_sizes:
        assert size % tokens_per_hash == 0
    total = sum(t.size for t in kv_cache_config.kv_cache_tensors)
    p = vllm_config.parallel
    return OffloadingConfig(
        groups=tuple(OffloadingGroupConfig(g.kv_cache_spec.block_size, tuple(g.layer_names), i)
                     for i, g in enumerate(groups)),
        worker_kv_bytes_per_block=total // kv_cache_config.num_blocks
        if kv_cache_config.num_blocks else 0,
        enable_kv_cache_events=vllm_config.enable_kv_cache_events,
        extra_config=extra,
        engine_id=vllm_config.engine_id,
        model=OffloadingModelConfig(vllm_config.model, str(vllm_config.dtype).replace(
            "torch.", "")),
        cache=OffloadingCacheConfig(tokens_per_hash, per_chunk),
        parallel=OffloadingParallelConfig(
            rank=p.rank, world_size=p.tp * p.pp, tp_size=p.tp, pp_size=p.pp, pcp_size=1,
            dcp_size=1, data_parallel_index=p.dp_index, data_parallel_size=p.dp_size,
            data_parallel_rank_local=None, is_parallelism_agnostic=False))
