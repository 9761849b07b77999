"""Stand-in of the config objects an OffloadingSpec reads (vllm/config/,
vllm-project/vllm; attributes as read by vllm/v1/kv_offload/spec.py and
cpu/spec.py at 0072b0b7443bdddf17824c78d4feae8e1fc12fb4 and by
factory.py at 07b13497a9b52274d334090a9a8e04d5ec9ca7e9). Only the attributes
those files read, plus the few an external spec needs to name its
namespace (model, dtype, parallel layout, engine_id); defaults are vLLM's
where the real default is known.

- VllmConfig.kv_transfer_config.kv_connector_extra_config: the dict from
  --kv-transfer-config's "kv_connector_extra_config" (spec_name,
  spec_module_path, the spec's own options).
- VllmConfig.cache_config.block_size: the hash block size (tokens).
- cache_config.prefix_caching_hash_algo: "sha256" (default), "sha256_cbor",
  "xxhash", "xxhash_cbor".
- parallel_config.world_size = tensor_parallel_size * pipeline_parallel_size
  (CPUOffloadingSpec multiplies the per-rank page by it).
- kv_events_config.enable_kv_cache_events gates OffloadingEvent capture.
"""
from dataclasses import dataclass, field
from typing import Any


@dataclass
class KVTransferConfig:
    kv_connector: str = "OffloadingConnector"
    kv_role: str = "kv_both"
    engine_id: str = "standin-engine"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)

    def get_from_extra_config(self, key, default):
        return self.kv_connector_extra_config.get(key, default)


@dataclass
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    cache_dtype: str = "auto"


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    rank: int = 0

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass
class ModelConfig:
    model: str = "standin/model"
    dtype: Any = None  # a torch.dtype in vLLM
    max_model_len: int = 4096
    revision: str | None = None


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256


@dataclass
class KVEventsConfig:
    enable_kv_cache_events: bool = False


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_transfer_config: KVTransferConfig | None = None
    kv_events_config: KVEventsConfig | None = None
