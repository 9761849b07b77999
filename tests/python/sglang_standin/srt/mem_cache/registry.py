"""Stand-in of python/sglang/srt/mem_cache/registry.py at sgl-project/sglang
034326fd (read_file id 60763969537; the same API at ca590d50): out-of-tree
radix cache backends. register_radix_cache_backend(name, factory) (ValueError
for an empty or taken name), get_radix_cache_factory(name),
registered_radix_cache_backends(); create_tree_cache(ctx) calls the factory
named by get_memory().radix_cache_backend (--radix-cache-backend, a free
string), ValueError naming the registered ones for an unknown name. A
factory takes a TreeCacheBuildContext (the fields as there) and returns the
cache. The default (built-in) factory is not in the stand-in."""
import dataclasses
from typing import Any, Optional

from ..runtime_context import get_memory

_BACKENDS = {}


@dataclasses.dataclass
class TreeCacheBuildContext:
    server_args: Any
    params: Any
    is_hybrid_swa: bool
    is_hybrid_ssm: bool
    enable_hierarchical_cache: bool
    disable_radix_cache: bool
    effective_chunked_prefill_size: Optional[int]
    tp_worker: Any
    model_config: Any
    tp_size: int
    tp_rank: int
    tp_group: Any
    full_tokens_per_layer: Optional[int] = None
    is_dsa: bool = False


def register_radix_cache_backend(name, factory):
    if not name:
        raise ValueError("a radix cache backend needs a name")
    if name in _BACKENDS:
        raise ValueError(f"radix cache backend {name!r} is registered already")
    _BACKENDS[name] = factory


def get_radix_cache_factory(name):
    return _BACKENDS.get(name)


def registered_radix_cache_backends():
    return sorted(_BACKENDS)


def create_tree_cache(ctx):
    name = get_memory().radix_cache_backend
    if not name:
        raise ValueError("the built-in radix caches are not in the stand-in")
    factory = get_radix_cache_factory(name)
    if factory is None:
        raise ValueError(f"unknown radix cache backend {name!r}; registered: "
                         f"{registered_radix_cache_backends()}. External backends must "
                         "call register_radix_cache_backend(...) at import time")
    return factory(ctx)


def _forget(name):
    """Stand-in only: unregisters (tests register the same plugin again)."""
    _BACKENDS.pop(name, None)
