"""The engine's device KV pool as HostkvLinker sees it, and where its pages
live in hostkvd. No SGLang imports.

SGLang main gives a linker no KV tensors: it reaches them through
params.token_to_kv_pool_allocator.get_kvcache(), the device pool
(MHATokenToKVPool: per-layer k_buffer / v_buffer of (size + page_size) token
rows; MLATokenToKVPool: per-layer kv_buffer). Main's pool view for linkers
(hybrid_cache/linker_pool_assembler.py) covers DSA and DeepSeek-V4 pools
only, so HostkvLinker builds this one itself from the per-layer buffers,
which is all hostkvd needs: it registers them (CUDA IPC, or shared memory on
the CPU backend) and copies pages between its pool and their token rows.

Where: one pool and one cache namespace per TP rank, named from what makes
two engines' pages interchangeable: the model, the KV geometry and dtype,
the page size, the TP size and the operator's namespace text. Every engine
of the same model and layout on the node, and the same engine after a
restart, find the same pages.
"""
import hashlib
import re

from .. import errors, mha_pool_spec, mla_pool_spec
from .remote_pool import _DTYPE_NAMES as DTYPE_NAMES



class DeviceKv:
    """The device pool's per-layer buffers: planes [K, V] (MHA) or [KV]
    (MLA), each a list of per-layer (rows, ...) tensors."""

    def __init__(self, kvcache, page_size):
        self.page_size = int(page_size)
        extra = sorted(a for a in vars(kvcache) if a.endswith("_scale_buffer")
                       or a.startswith("index_k")) if hasattr(kvcache, "__dict__") else []
        if extra:
            raise errors.InvalidArgument(
                f"{type(kvcache).__name__} has buffers beside the KV ({', '.join(extra)}): "
                "HostkvLinker would leave them unloaded (DSA indexers, FP4 scales are not "
                "served)")
        self.start_layer = int(getattr(kvcache, "start_layer", 0) or 0)
        # The logical KV dtype (fp8 e4m3 and e5m2 are both stored as uint8).
        self.logical_dtype = str(getattr(kvcache, "dtype", "") or "").replace("torch.", "")
        if getattr(kvcache, "k_buffer", None) is not None:
            self.attention = "mha"
            self.planes = [list(kvcache.k_buffer), list(kvcache.v_buffer)]
            k = self.planes[0][0]
            self.heads, self.head_dim = int(k.shape[1]), int(k.shape[2])
            v_dim = int(self.planes[1][0].shape[-1])
            if v_dim != self.head_dim:
                raise errors.InvalidArgument(
                    f"K head_dim {self.head_dim} and V head_dim {v_dim} differ: hostkv's MHA "
                    "pools have one head_dim")
        elif getattr(kvcache, "kv_buffer", None) is not None:
            self.attention = "mla"
            self.planes = [list(kvcache.kv_buffer)]
            self.kv_lora_rank = int(getattr(kvcache, "kv_lora_rank", 0))
            self.qk_rope_head_dim = int(getattr(kvcache, "qk_rope_head_dim", 0))
            self.kv_dim = int(self.planes[0][0].shape[-1])
        else:
            raise errors.InvalidArgument(
                f"{type(kvcache).__name__}: HostkvLinker serves MHA pools (k_buffer, "
                "v_buffer) and MLA pools (kv_buffer)")
        first = self.planes[0][0]
        self.layers = len(self.planes[0])
        self.rows = int(first.shape[0])
        self.dtype = first.dtype
        self.device = first.device
        for plane in self.planes:
            for t in plane:
                if tuple(t.shape) != tuple(plane[0].shape) or not t.is_contiguous():
                    raise errors.InvalidArgument(
                        "per-layer KV buffers of one shape, contiguous, are needed")
        name = str(self.dtype).replace("torch.", "")
        if name not in DTYPE_NAMES:
            raise errors.InvalidArgument(f"hostkv has no pool dtype for {self.dtype}")
        self.dtype_name = DTYPE_NAMES[name]

    def page_bytes(self):
        """Bytes of one page over every layer and plane."""
        return sum(self.layers * self.page_size * t.numel() // max(1, int(t.shape[0]))
                   * t.element_size() for t in (plane[0] for plane in self.planes))

    def geometry(self):
        if self.attention == "mha":
            return f"mha:{self.layers}x{self.heads}x{self.head_dim}"
        return f"mla:{self.layers}x{self.kv_lora_rank}+{self.qk_rope_head_dim}:{self.kv_dim}"

    def pool_spec(self, pool, capacity_bytes):
        if self.attention == "mha":
            return mha_pool_spec(pool, self.layers, self.heads, self.head_dim,
                                 self.page_size, dtype=self.dtype_name,
                                 capacity_bytes=capacity_bytes)
        extra = {}
        if self.kv_dim != self.kv_lora_rank + self.qk_rope_head_dim:
            extra["kv_cache_dim"] = self.kv_dim
        return mla_pool_spec(pool, self.layers, self.kv_lora_rank, self.qk_rope_head_dim,
                             self.page_size, dtype=self.dtype_name,
                             capacity_bytes=capacity_bytes, **extra)


class Placement:
    """The pool and namespace of one rank."""

    def __init__(self, model, kv, tp_size, rank, extra="", pool_prefix="sglang", owner=""):
        self.rank, self.tp_size = int(rank), int(tp_size)
        if not 0 <= self.rank < self.tp_size:
            raise ValueError(f"rank {rank} is outside the TP world of {tp_size}")
        # start_layer: pipeline stages with as many layers hold others.
        descriptor = ";".join([f"model={model}", f"kv={kv.geometry()}",
                               f"dtype={kv.dtype_name}/{kv.logical_dtype}",
                               f"page={kv.page_size}",
                               f"tp={tp_size}", f"layers_from={kv.start_layer}",
                               f"extra={extra}"])
        digest = hashlib.sha256(descriptor.encode()).hexdigest()
        readable = re.sub(r"[^A-Za-z0-9_.-]", "_",
                          str(model).rstrip("/").split("/")[-1])[:40] or "model"
        # owner: "uid<N>.", names only this user may take (_owned_names).
        self.pool = f"{owner}{pool_prefix}-{digest[:16]}-r{self.rank}"
        self.namespace = f"{owner}sglang:{readable}:tp{self.tp_size}:r{self.rank}:{digest[:24]}"
        self.descriptor = descriptor


def page_key(key):
    """SGLang's page hash (64 hex characters) as a 32-byte cache key."""
    if isinstance(key, (bytes, bytearray)):
        return bytes(key)
    try:
        raw = bytes.fromhex(key)
    except (TypeError, ValueError):
        raw = hashlib.sha256(str(key).encode()).digest()
    if not 1 <= len(raw) <= 64:
        raw = hashlib.sha256(raw).digest()
    return raw
