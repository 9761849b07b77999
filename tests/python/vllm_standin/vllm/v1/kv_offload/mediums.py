"""Stand-in of vllm/v1/kv_offload/mediums.py, modelled on vllm-project/vllm
at 0c2bbc477d0d615ee4d2581bbdfa966054db20f0.

- BlockIDsLoadStoreSpec(block_ids): block_ids kept as a 1-D numpy int64
  array (later versions: int32).
- GPULoadStoreSpec(block_ids, group_sizes, block_indices=None), medium
  "GPU": block ids of the worker's KV cache, ordered by KV cache group;
  group_sizes[i] blocks belong to group i (sum == len(block_ids));
  block_indices[i] is the request-relative index of group i's first block,
  set by the connector only for loads (the first GPU block may be
  unaligned to a larger offloaded block). Later versions require it.
- CPULoadStoreSpec(block_ids), medium "CPU": block ids of the CPU pool. A
  third-party spec may define its own LoadStoreSpec with its own medium().
"""
from abc import ABC
from collections.abc import Sequence

import numpy as np

from vllm.v1.kv_offload.abstract import LoadStoreSpec


class BlockIDsLoadStoreSpec(LoadStoreSpec, ABC):
    def __init__(self, block_ids: list[int]):
        self.block_ids = np.array(block_ids, dtype=np.int64)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.block_ids.tolist()})"


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    def __init__(self, block_ids: list[int], group_sizes: Sequence[int],
                 block_indices: Sequence[int] | None = None):
        super().__init__(block_ids)
        assert sum(group_sizes) == len(block_ids)
        assert block_indices is None or len(block_indices) == len(group_sizes)
        self.group_sizes = group_sizes
        self.block_indices = block_indices

    @staticmethod
    def medium() -> str:
        return "GPU"


class CPULoadStoreSpec(BlockIDsLoadStoreSpec):
    @staticmethod
    def medium() -> str:
        return "CPU"
