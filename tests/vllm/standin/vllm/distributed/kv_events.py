"""Models the parts of vllm/distributed/kv_events.py that the offloading
connector's events emit: BlockStored / BlockRemoved and the medium names."""
from dataclasses import dataclass

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


@dataclass
class BlockStored:
    block_hashes: list
    parent_block_hash: object
    token_ids: list
    block_size: int
    lora_id: object
    medium: str
    group_idx: int = 0


@dataclass
class BlockRemoved:
    block_hashes: list
    medium: str
    group_idx: int = 0
