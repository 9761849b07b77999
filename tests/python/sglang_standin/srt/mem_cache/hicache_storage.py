"""Stand-in of python/sglang/srt/mem_cache/hicache_storage.py at
001067fffe33427bee0ed2f007fb7551a1d76b44: the storage-backend interface
(HiCacheStorage), the config a backend is built with, the per-call extra
info, the v2 pool types and count_pool_hits, STORAGE_BATCH_SIZE. Field
orders, defaults, signatures and default behaviours are SGLang's; the
built-in HiCacheFile backend is not modelled.
"""
import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional

# The most pages one batched storage call carries; the controller splits
# its hit queries, page reads and page writes into batches of this size.
STORAGE_BATCH_SIZE = 128


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


@dataclass(frozen=True)
class PrefetchTimeoutConfig:
    base: float = 2.0
    per_ki_token: float = 0.1
    max: float = 30.0


class PoolName(str, enum.Enum):
    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"
    INDEXER = "indexer"
    DEEPSEEK_V4_C4 = "deepseek_v4_c4"
    DEEPSEEK_V4_C4_INDEXER = "deepseek_v4_c4_indexer"
    DEEPSEEK_V4_C128 = "deepseek_v4_c128"
    DEEPSEEK_V4_C4_STATE = "deepseek_v4_c4_state"
    DEEPSEEK_V4_C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
    DEEPSEEK_V4_C128_STATE = "deepseek_v4_c128_state"
    DRAFT = "draft"
    DRAFT_INDEXER = "draft_indexer"
    DRAFT_SWA = "draft_swa"

    def __str__(self):
        return self.value


class PoolHitPolicy(str, enum.Enum):
    ALL_PAGES = "all_pages"            # every page up to the KV hit must be there
    TRAILING_PAGES = "trailing_pages"  # only the last len(keys) pages must be there


@dataclass
class PoolTransfer:
    name: PoolName
    host_indices: Optional[Any] = None
    device_indices: Optional[Any] = None
    keys: Optional[List[str]] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: Optional[List[Any]] = None
    indices_from_pool: Optional[PoolName] = None


@dataclass(frozen=True)
class SidecarPoolSpec:
    pool_name: PoolName
    indices_from_pool: PoolName
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES


@dataclass
class PoolTransferResult:
    kv_hit_pages: int
    extra_pool_hit_pages: dict

    @classmethod
    def empty(cls):
        return cls(0, {})

    def update_kv_hit_pages(self, kv_hit_pages):
        self.kv_hit_pages = max(self.kv_hit_pages, kv_hit_pages)

    def update_extra_pool_hit_pages(self, results):
        self.extra_pool_hit_pages.update(results)


def count_pool_hits(results):
    """Per pool, how many results from the first are True."""
    counts = {}
    for name, oks in results.items():
        oks = list(oks)
        counts[name] = oks.index(False) if False in oks else len(oks)
    return counts


class HiCacheStorage(ABC):
    """What a storage backend is: five abstract calls (get, batch_get, set,
    batch_set, exists); defaults for the rest (the v1 and v2 calls raise
    NotImplementedError; batch_exists counts existing keys from the first)."""

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        if not hasattr(self, "registered_pools"):
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        raise NotImplementedError()

    def batch_get_v2(self, transfers, extra_info=None):
        raise NotImplementedError()

    def batch_set_v2(self, transfers, extra_info=None):
        raise NotImplementedError()

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        # Raises rather than returning None: the controller indexes the result.
        raise NotImplementedError()

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        raise NotImplementedError()

    @abstractmethod
    def get(self, key, target_location=None, target_sizes=None):
        """The value of `key` (None if it is not stored)."""

    @abstractmethod
    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Per key its value or None."""

    @abstractmethod
    def set(self, key, value=None, target_location=None, target_sizes=None):
        """True if stored."""

    @abstractmethod
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """True if every key is stored."""

    @abstractmethod
    def exists(self, key):
        """True if `key` is stored."""

    def batch_exists(self, keys, extra_info=None):
        for count, key in enumerate(keys):
            if not self.exists(key):
                return count
        return len(keys)

    def clear(self):
        pass

    def get_stats(self):
        return None
