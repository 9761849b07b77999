"""vLLM's canonical KV tensors as hostkv device buffers: checks, the pool
geometry they need, and block ids as slot runs. Pure torch, no vLLM.

A canonical tensor is an int8 view (num_blocks, page_bytes) of one region
of a worker's KV cache (vllm/v1/kv_offload/spec.py, CanonicalKVCacheTensor).
In hostkv terms each tensor is one "layer" of a blocks pool, each engine
block one token slot (a row of page_bytes), and an offloaded block of
block_size_factor engine blocks one host page.
"""
from .. import errors
from ..cache_calls import page_runs


def check_tensors(tensors):
    """(num_blocks, page_bytes) shared by every tensor; InvalidArgument for
    what hostkv cannot serve: no tensors, not 2-D, rows that are not
    contiguous (stride (page_bytes, 1)), tensors of different page sizes or
    block counts (hybrid models with several KV cache groups), or tensors on
    different devices."""
    if not tensors:
        raise errors.InvalidArgument("vLLM gave no KV cache tensors to offload")
    shapes = {tuple(t.shape) for t in tensors}
    for t in tensors:
        if t.dim() != 2:
            raise errors.InvalidArgument(
                f"a canonical KV tensor is (num_blocks, page_bytes), got shape {tuple(t.shape)}")
        if t.element_size() != 1:
            raise errors.InvalidArgument(
                f"a canonical KV tensor holds bytes (int8), got {t.dtype}")
        if t.stride() != (t.shape[1], 1):
            raise errors.InvalidArgument(
                f"KV blocks of {t.shape[1]} bytes lie {t.stride(0)} bytes apart: hostkv "
                "copies contiguous rows only")
    if len(shapes) != 1:
        raise errors.InvalidArgument(
            f"KV tensors of different shapes {sorted(shapes)}: hybrid models (several "
            "KV cache groups or page sizes) are not supported by hostkv.vllm")
    devices = {str(t.device) for t in tensors}
    if len(devices) != 1:
        raise errors.InvalidArgument(f"KV tensors on several devices: {sorted(devices)}")
    return shapes.pop()


def slot_runs(block_ids):
    """Block ids (any int sequence) as [(first, count)] runs of consecutive
    ids, in order."""
    return page_runs([int(b) for b in block_ids])


def check_block_ids(block_ids, num_blocks, what):
    """InvalidArgument for an id outside [0, num_blocks) or listed twice."""
    ids = [int(b) for b in block_ids]
    bad = [b for b in ids if not 0 <= b < num_blocks]
    if bad:
        raise errors.InvalidArgument(
            f"{what}: block id {bad[0]} is outside the {num_blocks} KV blocks")
    if len(set(ids)) != len(ids):
        raise errors.InvalidArgument(f"{what}: a block id is listed twice")
    return ids
