"""Stand-in of python/sglang/srt/mem_cache/storage/backend_factory.py at
001067fffe33427bee0ed2f007fb7551a1d76b44: StorageBackendFactory, as the
controller's attach_storage_backend calls it,
create_backend(backend_name, storage_config, mem_pool_host).

- A registered (built-in) name is built by its loader; the built-in
  backends are registered by name and module, lazily, and none of them is
  present in the stand-in (building one fails on import).
- "dynamic" (with storage_config.extra_config set): extra_config must
  name backend_name, module_path and class_name (ValueError otherwise);
  the module is imported, the class taken from it and required to be a
  subclass of HiCacheStorage (TypeError otherwise), and the backend is
  built as backend_class(storage_config, kwargs): the keywords given to
  create_backend as ONE positional dict (the controller gives none: {}).
  mem_pool_host is not passed; the controller registers it next
  (register_mem_pool_host).
- Any other name: ValueError.
"""
import importlib
import logging

from ..hicache_storage import HiCacheStorage

logger = logging.getLogger(__name__)

# name -> (module, class, how it is constructed), as 001067ff registers them.
_BUILTINS = {
    "file": ("sglang.srt.mem_cache.hicache_storage", "HiCacheFile", "config"),
    "sim": ("sglang.srt.mem_cache.storage.sim_storage", "SimHiCacheStorage", "config"),
    "nixl": ("sglang.srt.mem_cache.storage.nixl.hicache_nixl", "HiCacheNixl", "config"),
    "mooncake": ("sglang.srt.mem_cache.storage.mooncake_store.mooncake_store",
                 "MooncakeStore", "config+pool"),
    "hf3fs": ("sglang.srt.mem_cache.storage.hf3fs.storage_hf3fs", "HiCacheHF3FS", "hf3fs"),
    "aibrix": ("sglang.srt.mem_cache.storage.aibrix_kvcache.aibrix_kvcache_storage",
               "AibrixKVCacheStorage", "config+pool"),
    "eic": ("sglang.srt.mem_cache.storage.eic.eic_storage", "EICStorage", "config+pool"),
    "simm": ("sglang.srt.mem_cache.storage.simm.hicache_simm", "HiCacheSiMM", "config+pool"),
    "mori": ("sglang.srt.mem_cache.storage.umbp.umbp_store", "UMBPStore", "config+pool"),
    "shm": ("sglang.srt.mem_cache.storage.shm", "HiCacheShm", "config+pool"),
    "kvcc": ("sglang.srt.mem_cache.storage.kvcc.kvcc_store", "KVCCStore", "config+pool"),
}

_REQUIRED_DYNAMIC_FIELDS = ("backend_name", "module_path", "class_name")


class StorageBackendFactory:
    _registry = {}

    @staticmethod
    def _load_backend_class(module_path, class_name, backend_name):
        try:
            module = importlib.import_module(module_path)
        except ImportError as e:
            raise ImportError(
                f"Failed to import backend {backend_name!r} from {module_path!r}: {e}") from e
        try:
            backend_class = getattr(module, class_name)
        except AttributeError as e:
            raise AttributeError(
                f"Class {class_name!r} not found in module {module_path!r}: {e}") from e
        if not issubclass(backend_class, HiCacheStorage):
            raise TypeError(f"Backend class {class_name} must inherit from HiCacheStorage")
        return backend_class

    @classmethod
    def register_backend(cls, name, module_path, class_name, construction="config"):
        if name in cls._registry:
            logger.warning("Backend %r is already registered; overwriting", name)

        def loader():
            return cls._load_backend_class(module_path, class_name, name)

        cls._registry[name] = (loader, construction)

    @classmethod
    def create_backend(cls, backend_name, storage_config, mem_pool_host, **kwargs):
        if backend_name in cls._registry:
            return cls._create_builtin_backend(backend_name, storage_config, mem_pool_host,
                                               **kwargs)
        if backend_name == "dynamic" and storage_config.extra_config is not None:
            return cls._create_dynamic_backend(storage_config.extra_config, storage_config,
                                               mem_pool_host, **kwargs)
        raise ValueError(f"Unknown storage backend {backend_name!r}. Registered backends: "
                         f"{sorted(cls._registry)}")

    @classmethod
    def _create_builtin_backend(cls, backend_name, storage_config, mem_pool_host, **kwargs):
        loader, construction = cls._registry[backend_name]
        backend_class = loader()
        if construction == "config":
            return backend_class(storage_config)
        if construction == "hf3fs":
            if mem_pool_host.layout in ("page_first", "page_first_direct"):
                bytes_per_page = mem_pool_host.get_ksize_per_token() * mem_pool_host.page_size
            else:
                bytes_per_page = mem_pool_host.get_size_per_token() * mem_pool_host.page_size
            return backend_class.from_env_config(bytes_per_page, mem_pool_host.dtype,
                                                 storage_config)
        return backend_class(storage_config, mem_pool_host)

    @classmethod
    def _create_dynamic_backend(cls, backend_config, storage_config, mem_pool_host, **kwargs):
        for field in _REQUIRED_DYNAMIC_FIELDS:
            if field not in backend_config:
                raise ValueError(
                    f"Missing required field {field!r} in backend config for 'dynamic' backend")
        name = backend_config["backend_name"]
        backend_class = cls._load_backend_class(backend_config["module_path"],
                                                backend_config["class_name"], name)
        try:
            return backend_class(storage_config, kwargs)
        except Exception:
            logger.error("Failed to create dynamic storage backend %r", name)
            raise


for _name, (_module, _class, _construction) in _BUILTINS.items():
    StorageBackendFactory.register_backend(_name, _module, _class, _construction)
