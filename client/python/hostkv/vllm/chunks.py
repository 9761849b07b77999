"""vLLM v0.26+ offload keys and GPU block lists as hostkv pages. Pure
Python: no vLLM, no daemon.

vLLM keys one chunk of `blocks_per_chunk` (f) GPU blocks of one KV cache
group: the block hash of the chunk's last hash-block plus the group's index
(vllm/v1/kv_offload/base.py, make_offload_key: 4 bytes big-endian at the
end). hostkv keeps one page per GPU block (page_size 1 token slot = one
engine block), so that a load or store may start inside a chunk, as vLLM's
sliding-window groups and GPU prefix hits make it do: f == 1 keys the page
by the offload key itself; f > 1 keys page i of the chunk by the offload
key plus i as 2 bytes big-endian ("page keys").

A GPULoadStoreSpec lists GPU block ids ordered by group (group_sizes[i] of
group position i, the group's first block at request-relative index
block_indices[i]); the offload keys of a job are in the same group order,
each group's in chunk order. The group's first GPU block sits at
block_indices[i] % f inside its first chunk; every following block comes
next, chunk after chunk.
"""
from .. import errors
from ..cache_calls import MAX_KEY_BYTES as MAX_KEY
KEY_GROUP_BYTES = 4


def group_of(key):
    """The KV cache group index a vLLM offload key carries."""
    return int.from_bytes(bytes(key[-KEY_GROUP_BYTES:]), "big")


def page_keys(key, blocks_per_chunk):
    """The hostkv cache keys of one offload key's pages (one per GPU block)."""
    key = bytes(key)
    if len(key) <= KEY_GROUP_BYTES:
        raise errors.InvalidArgument(f"an offload key of {len(key)} bytes has no block hash")
    if blocks_per_chunk == 1:
        if len(key) > MAX_KEY:
            raise errors.InvalidArgument(f"an offload key of {len(key)} bytes (at most "
                                         f"{MAX_KEY})")
        return [key]
    if len(key) + 2 > MAX_KEY:
        raise errors.InvalidArgument(f"an offload key of {len(key)} bytes (at most "
                                     f"{MAX_KEY - 2} with blocks_per_chunk > 1)")
    return [key + i.to_bytes(2, "big") for i in range(blocks_per_chunk)]


class GroupRun:
    """One group's part of a job: the GPU block ids and the page keys they
    pair with, in order."""
    __slots__ = ("position", "block_ids", "page_keys")

    def __init__(self, position, block_ids, keys):
        self.position = position
        self.block_ids = block_ids
        self.page_keys = keys


def split_job(keys, gpu_spec, group_positions, blocks_per_chunk, num_blocks, what):
    """Pairs a job's offload keys with its GPU blocks, group by group.

    keys: the job's offload keys, in group order and chunk order within a
    group; gpu_spec: a GPULoadStoreSpec (block_ids, group_sizes,
    block_indices); group_positions: group index (as in the keys) ->
    position in the spec's group lists. Returns [GroupRun] for the groups
    with blocks. InvalidArgument when the two do not agree (no partial
    result)."""
    f = int(blocks_per_chunk)
    ids = [int(b) for b in gpu_spec.block_ids]
    sizes = [int(s) for s in gpu_spec.group_sizes]
    starts = [int(s) for s in gpu_spec.block_indices]
    if sum(sizes) != len(ids) or len(starts) != len(sizes):
        raise errors.InvalidArgument(
            f"{what}: {len(ids)} GPU blocks, group sizes {sizes}, block indices {starts}")
    bad = [b for b in ids if not 0 <= b < num_blocks]
    if bad:
        raise errors.InvalidArgument(
            f"{what}: GPU block id {bad[0]} is outside the {num_blocks} KV blocks")
    by_position = {}
    for key in keys:
        g = group_of(key)
        pos = group_positions.get(g)
        if pos is None or pos >= len(sizes):
            raise errors.InvalidArgument(f"{what}: a key of KV cache group {g}, which this "
                                         "worker does not offload")
        by_position.setdefault(pos, []).append(bytes(key))
    runs, first = [], 0
    for pos, size in enumerate(sizes):
        group_keys = by_position.pop(pos, [])
        block_ids = ids[first:first + size]
        first += size
        if size == 0:
            if group_keys:
                raise errors.InvalidArgument(
                    f"{what}: {len(group_keys)} keys for group position {pos}, which has no "
                    "GPU blocks")
            continue
        skip = starts[pos] % f
        need = -(-(size + skip) // f)
        if len(group_keys) != need:
            raise errors.InvalidArgument(
                f"{what}: group position {pos} has {size} GPU blocks from index "
                f"{starts[pos]} ({need} chunks of {f}) but {len(group_keys)} keys")
        pages = [pk for k in group_keys for pk in page_keys(k, f)][skip:skip + size]
        runs.append(GroupRun(pos, block_ids, pages))
    if by_position:
        raise errors.InvalidArgument(f"{what}: keys for groups without GPU blocks")
    return runs
