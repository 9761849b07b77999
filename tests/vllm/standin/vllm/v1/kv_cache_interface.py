"""Models the KV cache description vLLM's engine hands the offloading
connector (vllm/v1/kv_cache_interface.py): per group a spec (full attention
or sliding window; block size, heads, head size, dtype) and its layers;
tensors shared by one layer of each group (vLLM's hybrid allocator)."""
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    @property
    def page_size_bytes(self):
        # K and V of block_size tokens
        return 2 * self.block_size * self.num_kv_heads * self.head_size * \
            torch.empty((), dtype=self.dtype).element_size()

    @property
    def unpadded_page_size_bytes(self):
        return self.page_size_bytes


@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    sliding_window: int = 0


@dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: object


@dataclass
class KVCacheTensor:
    size: int
    shared_by: list


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list = field(default_factory=list)
