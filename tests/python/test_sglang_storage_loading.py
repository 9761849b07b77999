"""Stock SGLang's way of loading HostkvStorage, on a stand-in of its module
tree (SGLang is not installed here): --hicache-storage-backend dynamic makes
StorageBackendFactory import extra_config["module_path"], take
"class_name", require a subclass of HiCacheStorage (an ABC whose abstract
methods are get, batch_get, set, batch_set, exists), build it as
backend_class(storage_config, kwargs), then the controller calls
register_mem_pool_host(host_pool) and, with "interface_v1", the zero-copy
batch calls. The factory below does what storage/backend_factory.py does."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))

STANDIN = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/mem_cache/__init__.py": "",
    "sglang/srt/mem_cache/hicache_storage.py": """
        from abc import ABC, abstractmethod
        from dataclasses import dataclass
        from typing import Any, List, Optional

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

        class HiCacheStorage(ABC):
            def register_mem_pool_host(self, mem_pool_host):
                self.mem_pool_host = mem_pool_host
            def batch_get_v1(self, keys, host_indices, extra_info=None):
                raise NotImplementedError()
            def batch_set_v1(self, keys, host_indices, extra_info=None):
                raise NotImplementedError()
            @abstractmethod
            def get(self, key, target_location=None, target_sizes=None): pass
            @abstractmethod
            def batch_get(self, keys, target_locations=None, target_sizes=None): pass
            @abstractmethod
            def set(self, key, value=None, target_location=None, target_sizes=None): pass
            @abstractmethod
            def batch_set(self, keys, values=None, target_locations=None,
                          target_sizes=None): pass
            @abstractmethod
            def exists(self, key): pass
            def batch_exists(self, keys, extra_info=None):
                for i in range(len(keys)):
                    if not self.exists(keys[i]):
                        return i
                return len(keys)
            def clear(self): pass
            def get_stats(self): return None
    """,
    "sglang/srt/mem_cache/storage/__init__.py": "",
    "sglang/srt/mem_cache/storage/backend_factory.py": """
        import importlib
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

        def create_backend(backend_name, storage_config, mem_pool_host, **kwargs):
            assert backend_name == "dynamic"
            config = storage_config.extra_config
            module = importlib.import_module(config["module_path"])
            backend_class = getattr(module, config["class_name"])
            if not issubclass(backend_class, HiCacheStorage):
                raise TypeError("must inherit from HiCacheStorage")
            return backend_class(storage_config, kwargs)
    """,
}

PROBE = """
import json, sys
import torch
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig,
                                                  HiCacheStorageExtraInfo)
from sglang.srt.mem_cache.storage import backend_factory
from sglang_model import DevicePool, InProcessHostPool, page_keys

device = DevicePool("mha", 2, size=64, page_size=16)
host = InProcessHostPool(device, "page_first")
config = HiCacheStorageConfig(
    tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
    is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
    model_name="standin/model",
    extra_config={{"backend_name": "hostkv", "module_path": "hostkv.sglang.storage",
                   "class_name": "HostkvStorage", "interface_v1": True,
                   "target": {target!r}, "pool_name": "standin-loading"}})
backend = backend_factory.create_backend("dynamic", config, host)
backend.register_mem_pool_host(host)
device.fill_random(torch.Generator().manual_seed(5))
idx = host.alloc(48)
host.backup_from_device_all_layer(device, idx, torch.arange(48), "kernel")
keys = page_keys(list(range(1000, 1048)), 16)
stored = backend.batch_set_v1(keys[1:], idx[16:], HiCacheStorageExtraInfo(keys[:1]))
print(json.dumps({{
    "is_hicache_storage": isinstance(backend, HiCacheStorage),
    "namespace": backend.namespace,
    "stored": stored,
    "exists_all": backend.batch_exists(keys),
    "exists_tail": backend.batch_exists(keys[1:]),
    "stats": backend.get_stats(),
}}))
backend.close()
"""


def write_tree(root):
    for path, text in STANDIN.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(text))


def test_stock_sglangs_dynamic_backend_loads_it(daemon, tmp_path):
    write_tree(str(tmp_path))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path), HERE, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", PROBE.format(target=daemon.target)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["is_hicache_storage"] is True  # subclasses the importable HiCacheStorage
    assert result["namespace"] == "sglang/standin/model/tp0-1/p16/sha256"
    assert result["stored"] == [True, True]
    # Only keys[1:] were stored: the prefix from the first key misses.
    assert result["exists_all"] == 0 and result["exists_tail"] == 2
    assert result["stats"] is None
