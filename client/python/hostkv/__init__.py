"""hostkv: the Python client of hostkvd, the node-local host KV-cache daemon.

    import hostkv
    with hostkv.Client("unix:/run/hostkv/hostkvd.sock", "engine-rank0") as c:
        pool = c.create_pool(hostkv.mha_pool_spec("llama", num_layers=32,
                             num_kv_heads=8, head_dim=128, page_size=16,
                             capacity_tokens=1 << 20))

hostkv.pb is the generated hostkv.v1 message module (PoolSpec, Layout, ...);
hostkv.shm and hostkv.torch hold the device-buffer helpers; hostkv.cuda
exports CUDA tensors and waits for layers on CUDA streams (GpuSignals).
The page cache's calls (Client.publish, lookup, release, copy_pages) are in
hostkv.cache_calls; hostkv.sglang.HostkvStorage puts SGLang's HiCache
storage tier on them.
"""
from . import errors
from ._proto import hostkv_pb2 as pb
from .cache_calls import Lookup, Published, cache_key
from .client import DEFAULT_TARGET, Client, Operation, count_tokens
from .errors import HostKVError

_DTYPES = {"bf16": pb.DTYPE_BF16, "fp16": pb.DTYPE_FP16, "fp32": pb.DTYPE_FP32,
           "fp8_e4m3": pb.DTYPE_FP8_E4M3, "fp8_e5m2": pb.DTYPE_FP8_E5M2}
_LAYOUTS = {"layer_first": pb.LAYOUT_LAYER_FIRST, "page_first": pb.LAYOUT_PAGE_FIRST,
            "page_first_direct": pb.LAYOUT_PAGE_FIRST_DIRECT,
            "page_head": pb.LAYOUT_PAGE_HEAD}


def _spec(name, geometry, page_size, layout, capacity_tokens, capacity_bytes, **extra):
    spec = pb.PoolSpec(name=name, geometry=geometry, page_size=page_size,
                       layout=_LAYOUTS.get(layout, layout), **extra)
    if capacity_tokens is not None:
        spec.capacity_tokens = capacity_tokens
    elif capacity_bytes is not None:
        spec.capacity_bytes = capacity_bytes
    return spec


def mha_pool_spec(name, num_layers, num_kv_heads, head_dim, page_size, dtype="bf16",
                  layout="page_first", capacity_tokens=None, capacity_bytes=None, **extra):
    """A PoolSpec for multi-head attention (dtype/layout by name or enum)."""
    geometry = pb.Geometry(mha=pb.MhaGeometry(num_layers=num_layers, num_kv_heads=num_kv_heads,
                                              head_dim=head_dim),
                           dtype=_DTYPES.get(dtype, dtype))
    return _spec(name, geometry, page_size, layout, capacity_tokens, capacity_bytes, **extra)


def mla_pool_spec(name, num_layers, kv_lora_rank, qk_rope_head_dim, page_size, dtype="bf16",
                  layout="page_first", capacity_tokens=None, capacity_bytes=None,
                  kv_cache_dim=None, **extra):
    """A PoolSpec for multi-head latent attention.

    kv_cache_dim: the row width in elements when it is not kv_lora_rank +
    qk_rope_head_dim (SGLang's override_kv_cache_dim, e.g. 656 for DSA/NSA
    fp8 rows; use a 1-byte dtype for uint8 rows); None leaves it unset.
    """
    mla = pb.MlaGeometry(num_layers=num_layers, kv_lora_rank=kv_lora_rank,
                         qk_rope_head_dim=qk_rope_head_dim)
    if kv_cache_dim is not None:
        mla.kv_cache_dim = kv_cache_dim
    geometry = pb.Geometry(mla=mla, dtype=_DTYPES.get(dtype, dtype))
    return _spec(name, geometry, page_size, layout, capacity_tokens, capacity_bytes, **extra)


def blocks_pool_spec(name, num_tensors, block_bytes, page_size=1, layout="page_first",
                     capacity_tokens=None, capacity_bytes=None, **extra):
    """A PoolSpec of raw blocks (vLLM's offloading, hostkv.vllm): per tensor
    one row of block_bytes bytes per token slot, one slot per engine block.
    page_first keeps a slot's rows of every tensor together."""
    geometry = pb.Geometry(blocks=pb.BlocksGeometry(num_tensors=num_tensors,
                                                    block_bytes=block_bytes))
    return _spec(name, geometry, page_size, layout, capacity_tokens, capacity_bytes, **extra)


__all__ = ["Client", "Operation", "HostKVError", "errors", "pb", "DEFAULT_TARGET",
           "count_tokens", "mha_pool_spec", "mla_pool_spec", "blocks_pool_spec", "Lookup", "Published",
           "cache_key"]
