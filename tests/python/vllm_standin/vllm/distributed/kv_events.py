"""Stand-in of the two events of vllm/distributed/kv_events.py that the
OffloadingConnector's take_events yields (scheduler.py at
0072b0b7443bdddf17824c78d4feae8e1fc12fb4): an OffloadingEvent with
removed=True becomes BlockRemoved(block_hashes, medium); removed=False
becomes BlockStored(block_hashes, parent_block_hash=None, token_ids=[],
block_size, lora_id=None, medium, lora_name=None)."""
from dataclasses import dataclass, field


@dataclass
class BlockStored:
    block_hashes: list
    parent_block_hash: bytes | None
    token_ids: list = field(default_factory=list)
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


@dataclass
class BlockRemoved:
    block_hashes: list
    medium: str | None = None
