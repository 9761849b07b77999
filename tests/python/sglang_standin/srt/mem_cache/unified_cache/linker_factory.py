"""Stand-in of python/sglang/srt/mem_cache/unified_cache/linker_factory.py
at sgl-project/sglang 2c62dc66 (PR #40595, read_file id 69244597631):
create_unified_cache_linker(server_args, params, *, components) builds the
linker named by get_memory().unified_cache_external_linker_config: imports
linker_module_path (errors of the plugin's own imports are not masked),
takes the class named linker, requires a UnifiedCacheLinker subclass that is
not abstract (ValueError listing what is missing), and constructs it as
cls(server_args, params, components=components,
extra_config=deepcopy(linker_extra_config)). Built-in backends (mooncake,
mori) are not in the stand-in."""
import copy
import importlib
import inspect

from .linker_config import UnifiedCacheLinkerConfig
from .unified_cache_linker import UnifiedCacheLinker
from ...runtime_context import get_memory


def create_unified_cache_linker(server_args, params, *, components):
    raw = get_memory().unified_cache_external_linker_config
    if raw is None:
        raise ValueError("built-in linker backends are not in the stand-in")
    config = UnifiedCacheLinkerConfig.from_dict(raw)
    module = importlib.import_module(config.linker_module_path)
    cls = getattr(module, config.linker, None)
    if not (inspect.isclass(cls) and issubclass(cls, UnifiedCacheLinker)):
        raise ValueError(f"{config.linker_module_path}.{config.linker} is not a "
                         "UnifiedCacheLinker")
    if inspect.isabstract(cls):
        raise ValueError(f"{config.linker} leaves abstract: "
                         f"{sorted(cls.__abstractmethods__)}")
    return cls(server_args, params, components=components,
               extra_config=copy.deepcopy(config.linker_extra_config))
