"""Stand-in of vllm/v1/kv_offload/abstract.py (vLLM v0.19-v0.20 era),
modelled on vllm-project/vllm at 00d169bfa55967fc48d6f1b08cfc929c1cce3545
(that stored version also carries lookup_prefix/prepare_load_prefix, which
upstream releases lack; left out) and on docs.vllm.ai v0.20.0
api/vllm/v1/kv_offload/abstract. The lookup result None ("try again later")
is how the connector at 0072b0b7443bdddf17824c78d4feae8e1fc12fb4 treats it.

The OffloadingManager runs in the SCHEDULER process (one per engine). It
tracks which blocks are offloaded, keyed by block hash (bytes):
- lookup(hashes) -> int | None: how many blocks from the first are all
  offloaded and readable; None: cannot tell yet, ask again next step.
- prepare_load(hashes) -> LoadStoreSpec: pins the blocks (no eviction)
  until complete_load(hashes). All of them must be offloaded.
- touch(hashes): recency only (also for blocks the GPU prefix cache hit).
- prepare_store(hashes) -> PrepareStoreOutput | None: which of the hashes
  need storing (already-stored ones are dropped), where to write them, and
  which hashes were evicted to make room; None if they cannot be stored.
- complete_store(hashes, success=True): stored blocks become loadable; on
  success=False the blocks not yet stored are dropped.
- take_events() -> Iterable[OffloadingEvent] since the last call.
Only lookup, prepare_load and prepare_store are abstract.
"""
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

from vllm.v1.core.kv_cache_utils import BlockHash


class LoadStoreSpec(ABC):
    """Where blocks are, for a worker to load from or store into. medium()
    names the kind ("GPU", "CPU", ...): the worker routes a transfer by the
    (src.medium(), dst.medium()) pair."""

    @staticmethod
    @abstractmethod
    def medium() -> str:
        ...


@dataclass
class PrepareStoreOutput:
    block_hashes_to_store: list[BlockHash]
    store_spec: LoadStoreSpec
    block_hashes_evicted: list[BlockHash]


@dataclass
class OffloadingEvent:
    block_hashes: list[BlockHash]
    block_size: int  # tokens per offloaded block
    medium: str
    removed: bool  # True: evicted/removed; False: stored


class OffloadingManager(ABC):
    @abstractmethod
    def lookup(self, block_hashes: Iterable[BlockHash]) -> int | None:
        ...

    @abstractmethod
    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        ...

    def touch(self, block_hashes: Iterable[BlockHash]):
        return

    def complete_load(self, block_hashes: Iterable[BlockHash]):
        return

    @abstractmethod
    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        ...

    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True):
        return

    def take_events(self) -> Iterable[OffloadingEvent]:
        return ()
