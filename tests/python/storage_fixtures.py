"""What the HostkvStorage tests build: SGLang's HiCacheStorageConfig, the
engine's pools (device, in-process or remote host pool), the storage as
SGLang's StorageBackendFactory makes it, and a prompt's KV with its keys."""
import dataclasses
from typing import Optional

import torch

from hostkv.sglang import HostkvStorage, RemoteMHATokenToKVPoolHost, RemoteMLATokenToKVPoolHost

from sglang_model import DevicePool, InProcessHostPool, page_keys

LAYERS = 2


@dataclasses.dataclass
class StorageConfig:
    """SGLang's HiCacheStorageConfig (mem_cache/hicache_storage.py), its fields."""
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    is_mla_model: bool = False
    enable_storage_metrics: bool = False
    is_page_first_layout: bool = False
    model_name: Optional[str] = "test-org/test-model"
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


def extra_config(target, **more):
    """The extra config stock SGLang is started with, plus ours."""
    return {"backend_name": "hostkv", "module_path": "hostkv.sglang.storage",
            "class_name": "HostkvStorage", "interface_v1": True, "target": target, **more}


def make_storage(host_pool, target, config=None, **extra):
    """As StorageBackendFactory._create_dynamic_backend then the controller:
    backend_class(storage_config, kwargs), register_mem_pool_host(pool)."""
    config = config or StorageConfig(is_mla_model=not hasattr(host_pool, "head_num"))
    config.extra_config = extra_config(target, **extra)
    storage = HostkvStorage(config, {})
    storage.register_mem_pool_host(host_pool)
    return storage


class Engine:
    """One engine rank: a device pool and a host pool (SGLang's own,
    in-process, or hostkv's remote one), and its storage tier."""

    def __init__(self, daemon, attention="mha", layout="page_first", page_size=16,
                 remote=False, pool_name=None, config=None, dtype=torch.bfloat16, **extra):
        self.device = DevicePool(attention, LAYERS, size=16 * page_size, page_size=page_size,
                                 dtype=dtype)
        self.io_backend = "direct" if layout == "page_first_direct" else "kernel"
        if remote:
            cls = RemoteMHATokenToKVPoolHost if attention == "mha" else \
                RemoteMLATokenToKVPoolHost
            self.host = cls(self.device, 2.0, 0, page_size, layout, target=daemon.target,
                            pool_name=pool_name)
        else:
            self.host = InProcessHostPool(self.device, layout)
            if pool_name:
                extra["pool_name"] = pool_name
        self.storage = make_storage(self.host, daemon.target, config, **extra)
        self.page_size = page_size

    def prefill(self, tokens, seed):
        """The KV of `tokens` (random, from `seed`) backed up to fresh host
        pages; returns (host_indices, SGLang's page keys)."""
        n = len(tokens) - len(tokens) % self.page_size
        self.device.fill_random(torch.Generator().manual_seed(seed))
        host_indices = self.host.alloc(n)
        self.host.backup_from_device_all_layer(self.device, host_indices, torch.arange(n),
                                               self.io_backend)
        return host_indices, page_keys(tokens, self.page_size)

    def page_bytes(self, host_indices):
        """The host pool's bytes of each page of `host_indices`."""
        return [self.host.get_data_page(int(i)).contiguous().view(torch.uint8)
                .numpy().tobytes() for i in host_indices[::self.page_size].tolist()]

    def close(self):
        self.storage.close()
        if hasattr(self.host, "close"):
            self.host.close()


def tokens_of(seed, count):
    """A prompt of `count` token ids (deterministic)."""
    return torch.randint(0, 150_000, (count,),
                         generator=torch.Generator().manual_seed(seed)).tolist()
