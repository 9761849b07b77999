"""Stand-in of vllm/v1/kv_offload/spec.py (vLLM v0.19-v0.20 era). The
constructor (vllm_config, kv_cache_config) and get_handlers(CanonicalKVCaches)
are as at vllm-project/vllm 0072b0b7443bdddf17824c78d4feae8e1fc12fb4 (that
stored version also has a hybrid-chunk planner, left out); the base-class
attributes are those of the v0.18.0 / v0.20.2 pages of docs.vllm.ai
(api/vllm/v1/kv_offload/spec). The older API (v0.11-v0.13,
22d23bda218999bf27be116a99f2f734ad7c597e) took (vllm_config) only and
get_handlers(kv_caches: dict[str, torch.Tensor]); see drive.create_spec.

OffloadingSpec is constructed in BOTH processes (the connector builds one
per role): get_manager() is called in the scheduler, get_handlers() in each
worker, once, after the KV caches exist. Base-class attributes:
vllm_config, kv_cache_config, extra_config (kv_connector_extra_config),
hash_block_size (cache_config.block_size), gpu_block_size (tuple, one per
KV cache group), block_size_factor (extra_config "block_size" divided by
the GPU block size; 1 when unset; needs all groups of one block size).

CanonicalKVCaches (what get_handlers receives):
- tensors: list of CanonicalKVCacheTensor(tensor, page_size_bytes), each
  tensor of shape (num_blocks, page_size_bytes), dtype int8, on the worker's
  GPU, a view into vLLM's own KV cache (FlashAttention's (2, num_blocks, ...)
  per-layer cache is split into a K and a V tensor);
- group_data_refs: per KV cache group, a list of
  CanonicalKVCacheRef(tensor_idx, page_size_bytes (un-padded)).
"""
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from vllm.logger import init_logger
from vllm.v1.kv_offload.abstract import LoadStoreSpec, OffloadingManager
from vllm.v1.kv_offload.worker.worker import OffloadingHandler

logger = init_logger(__name__)


@dataclass
class CanonicalKVCacheTensor:
    tensor: torch.Tensor
    page_size_bytes: int


@dataclass
class CanonicalKVCacheRef:
    tensor_idx: int
    page_size_bytes: int


@dataclass
class CanonicalKVCaches:
    tensors: list[CanonicalKVCacheTensor]
    group_data_refs: list[list[CanonicalKVCacheRef]]


class OffloadingSpec(ABC):
    def __init__(self, vllm_config, kv_cache_config):
        logger.warning("Initializing OffloadingSpec (stand-in). The API is experimental.")
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        kv_transfer_config = vllm_config.kv_transfer_config
        assert kv_transfer_config is not None
        self.extra_config = kv_transfer_config.kv_connector_extra_config
        self.hash_block_size = vllm_config.cache_config.block_size
        self.gpu_block_size: tuple[int, ...] = tuple(
            group.kv_cache_spec.block_size for group in kv_cache_config.kv_cache_groups)
        for block_size in self.gpu_block_size:
            assert block_size % self.hash_block_size == 0
        self.block_size_factor: int = 1
        offloaded = self.extra_config.get("block_size")
        if offloaded is not None:
            sizes = set(self.gpu_block_size)
            assert len(sizes) == 1, "'block_size' needs one GPU block size for all groups"
            gpu_block_size = sizes.pop()
            assert int(offloaded) % gpu_block_size == 0
            self.block_size_factor = int(offloaded) // gpu_block_size

    @abstractmethod
    def get_manager(self) -> OffloadingManager:
        ...

    @abstractmethod
    def get_handlers(
        self, kv_caches: CanonicalKVCaches
    ) -> Iterator[tuple[type[LoadStoreSpec], type[LoadStoreSpec], OffloadingHandler]]:
        ...
