"""Stand-in of vllm/v1/kv_cache_interface.py: the KVCacheConfig an
OffloadingSpec receives as its second constructor argument (v0.14+), with
the attributes spec.py and cpu/spec.py read at
0072b0b7443bdddf17824c78d4feae8e1fc12fb4: kv_cache_config.num_blocks,
.kv_cache_tensors (one per shared tensor), .kv_cache_groups[i].layer_names
and .kv_cache_spec.{block_size, page_size_bytes}.

page_size_bytes of full attention is the bytes of one block of one layer
for K and V together: 2 * block_size * num_kv_heads * head_size * itemsize
(MLA: 1 * block_size * head_size * itemsize, one latent per token).
"""
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    @property
    def page_size_bytes(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.block_size * self.num_kv_heads * self.head_size * itemsize


@dataclass(frozen=True)
class MLAAttentionSpec:
    block_size: int
    num_kv_heads: int  # 1 for MLA
    head_size: int  # kv_lora_rank + qk_rope_head_dim
    dtype: torch.dtype

    @property
    def page_size_bytes(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return self.block_size * self.num_kv_heads * self.head_size * itemsize


@dataclass
class KVCacheTensor:
    size: int  # bytes
    shared_by: list[str] = field(default_factory=list)


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: object


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec]
