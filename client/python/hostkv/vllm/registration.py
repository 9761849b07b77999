"""What both of hostkv.vllm's specs (v0.11-v0.20 spec.py, v0.26+
spec_v026.py) do to put a worker's KV tensors under hostkvd: the blocks
pool (made, or attached when another instance made it), the tensors
registered as its device buffers (CUDA IPC with GPU signal words, or
shared memory on the CPU backend), and the warning about unseeded block
hashes. No vLLM imports."""
import logging
import os

from .. import blocks_pool_spec, errors

logger = logging.getLogger("hostkv.vllm")


def warn_if_hashes_unseeded():
    if not os.environ.get("PYTHONHASHSEED"):
        logger.warning(
            "PYTHONHASHSEED is not set: vLLM's block hashes start from a random "
            "seed in each process, so no other instance (and no restart of this "
            "one) will find the blocks this one offloads. Set PYTHONHASHSEED to "
            "the same value for every instance that should share them.")


def attach_blocks_pool(client, pool, num_tensors, block_bytes, page_size, capacity_bytes):
    """Creates the pool, or uses the one another instance made (with its
    own capacity) if its blocks have this geometry; AlreadyExists if not."""
    spec = blocks_pool_spec(pool, num_tensors, block_bytes, page_size=page_size,
                            capacity_bytes=capacity_bytes)
    try:
        client.create_pool(spec, attach_if_exists=True)
        return
    except errors.AlreadyExists:
        pass
    have = client.get_pool(pool).spec
    b = have.geometry.blocks
    if not have.geometry.HasField("blocks") or (b.num_tensors, b.block_bytes,
                                                 have.page_size) != (
            num_tensors, block_bytes, page_size):
        raise errors.AlreadyExists(
            f"pool {pool} exists with another geometry ({have.geometry}, page_size "
            f"{have.page_size}); this worker has {num_tensors} tensors of {block_bytes}-byte "
            f"blocks, {page_size} per page")
    logger.info("pool %s exists with another capacity; using it as it is", pool)


def register_tensors(client, pool, num_blocks, tensors):
    """Registers the tensors (one row per block) as the pool's device
    buffers: (import_id, GpuSignals or None)."""
    if tensors[0].device.type == "cuda":
        from .. import cuda as hkc  # pylint: disable=import-outside-toplevel
        signals = hkc.GpuSignals(len(tensors), tensors[0].device)
        buffers = [hkc.export_cuda(t) for t in tensors]
        import_id = client.register_device_buffers(pool, num_blocks, buffers,
                                                   gpu_signals=signals.buffer)
        signals.attach_kv_word(client, import_id)
        return import_id, signals
    from .. import torch as hkt  # pylint: disable=import-outside-toplevel
    buffers = [hkt.describe(client, t) for t in tensors]
    return client.register_device_buffers(pool, num_blocks, buffers), None
