"""Models vllm/v1/kv_offload/base.py at vllm-project/vllm 0105e232 (the C2
API of vLLM v0.26+): offload keys, LookupResult, Medium, ReqContext,
OffloadingManager, GPULoadStoreSpec, Canonical KV caches, TransferResult,
OffloadingWorker, OffloadingSpec(config). Names, signatures, defaults and
asserts as there; written here from those facts. kv_hints and the metric
metadata classes are left out (nothing in hostkv.vllm reads them)."""
import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from vllm.v1.kv_offload.config import OffloadingConfig  # noqa: F401 (as upstream)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

_GROUP_BYTES = 4


def make_offload_key(block_hash, group_idx):
    return bytes(block_hash) + int(group_idx).to_bytes(_GROUP_BYTES, "big", signed=False)


def get_offload_block_hash(key):
    return key[:-_GROUP_BYTES]


def get_offload_group_idx(key):
    return int.from_bytes(key[-_GROUP_BYTES:], "big", signed=False)


class Medium(enum.Enum):
    CPU = "CPU"
    STORAGE = "STORAGE"


class Locality(enum.Enum):
    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: Any = None
    kv_hints: Any = None
    _state: dict = field(default_factory=dict, repr=False, init=False)
    _offload_key_positions: dict = field(default_factory=dict, repr=False, init=False)

    def set_state(self, val):
        self._state[type(val)] = val

    def get_state(self, cls):
        return self._state.get(cls)

    def set_offload_key_position(self, key, end_token):
        self._offload_key_positions[key] = end_token

    def get_offload_key_position(self, key):
        return self._offload_key_positions.get(key)


class LookupResult(enum.Enum):
    MISS = enum.auto()
    HIT = enum.auto()
    HIT_PENDING = enum.auto()
    RETRY = enum.auto()


class OffloadPolicy(enum.Enum):
    CHUNK_LEVEL = "chunk_level"
    REQUEST_LEVEL = "request_level"


@dataclass
class RequestOffloadingContext:
    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


class ScheduleEndContext(NamedTuple):
    new_req_ids: Any
    preempted_req_ids: Any


class LoadStoreSpec:
    """What a worker needs to load or store blocks (opaque to vLLM)."""


@dataclass
class PrepareStoreOutput:
    keys_to_store: list
    store_spec: LoadStoreSpec
    evicted_keys: list


@dataclass
class OffloadingEvent:
    keys: list
    medium: Medium
    removed: bool
    locality: Any = None
    ownership: Any = None
    removal_expected: bool = False


@dataclass(frozen=True)
class OffloadingKVEventsConfig:
    enable_kv_cache_events: bool
    self_describing_kv_events: bool


class OffloadingManager(ABC):
    @abstractmethod
    def lookup(self, key, req_context):
        ...

    def get_load_source(self, key, req_context):
        return CacheHitSource.EXTERNAL_UNSPECIFIED

    @abstractmethod
    def prepare_load(self, keys, req_context):
        ...

    def touch(self, keys, req_context):
        return

    def complete_load(self, keys, req_context):
        return

    @abstractmethod
    def prepare_store(self, keys, req_context):
        ...

    def complete_store(self, keys, req_context, success=True):
        return

    @abstractmethod
    def on_new_request(self, req_context):
        ...

    def on_request_finished(self, req_context):
        return

    def take_events(self):
        return ()

    def on_schedule_end(self, context):
        return

    def has_pending_work(self):
        return False

    def reset_cache(self):
        return

    def get_stats(self):
        return None

    def shutdown(self):
        return


class BlockIDsLoadStoreSpec(LoadStoreSpec, ABC):
    def __init__(self, block_ids):
        self.block_ids = np.array(block_ids, dtype=np.int32)


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    def __init__(self, block_ids, group_sizes, block_indices):
        super().__init__(block_ids)
        assert sum(group_sizes) == len(block_ids)
        assert len(block_indices) == len(group_sizes)
        self.group_sizes = group_sizes
        self.block_indices = block_indices


@dataclass
class CanonicalKVCacheTensor:
    tensor: Any
    page_size_bytes: int


@dataclass
class CanonicalKVCacheRef:
    tensor_idx: int
    page_size_bytes: int
    mapping: Any = None


@dataclass
class CanonicalKVCaches:
    tensors: list
    group_data_refs: list


@dataclass
class TransferResult:
    job_id: int
    success: bool
    transfer_size: Any = None
    transfer_time: Any = None


class OffloadingWorker(ABC):
    @abstractmethod
    def submit_store(self, job_id, src_spec, dst_spec):
        ...

    @abstractmethod
    def submit_load(self, job_id, src_spec, dst_spec):
        ...

    @abstractmethod
    def get_finished(self):
        ...

    @abstractmethod
    def wait(self, job_ids):
        ...

    def shutdown(self):
        return


class OffloadingSpec(ABC):
    @classmethod
    def build_metric_definitions(cls, extra_config):
        return {}

    def __init__(self, config):
        self.config = config
        self.extra_config = config.extra_config
        self.replicated_layout = False
        self.kv_events_config = OffloadingKVEventsConfig(
            enable_kv_cache_events=config.enable_kv_cache_events,
            self_describing_kv_events=bool(
                self.extra_config.get("self_describing_kv_events", False)))
        self.offload_prompt_only = bool(self.extra_config.get("offload_prompt_only", True))
        self.max_recompute_pending_tokens = int(
            self.extra_config.get("max_recompute_pending_tokens", 0))
        if self.max_recompute_pending_tokens < 0:
            raise ValueError("max_recompute_pending_tokens must be non-negative")
        self.tokens_per_block = tuple(g.tokens_per_block for g in config.groups)
        self.tokens_per_hash = config.cache.tokens_per_hash
        self.blocks_per_chunk = config.cache.blocks_per_chunk

    @abstractmethod
    def get_manager(self):
        ...

    @abstractmethod
    def get_worker(self, kv_caches):
        ...
