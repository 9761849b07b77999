"""Stand-in of what an out-of-tree radix cache factory touches of
python/sglang/srt/mem_cache/unified_radix_cache.py (the version with linker
hooks, read_file id 57358901232): UnifiedRadixCache(params) takes its
components from params.tree_components; init_cache_linker(linker) wraps the
linker (UnifiedCacheLinkerWrapper: FULL and SWA components only, else
ValueError) as cache.linker, whose cache_linker is the linker itself. The
tree is not modelled (tests/python/sglang_linker_driver.py drives the
linker in the wrapper's order)."""
from .unified_cache.components import ComponentType


class _Wrapper:
    def __init__(self, cache, cache_linker):
        unsupported = set(cache.components) - {ComponentType.FULL, ComponentType.SWA}
        if unsupported:
            raise ValueError("External cache linker supports only Full and SWA tree "
                             f"components; unsupported: {sorted(c.name for c in unsupported)}")
        self.cache_linker = cache_linker

    @property
    def layer_done_counter(self):
        return self.cache_linker.layer_done_counter


class UnifiedRadixCache:
    def __init__(self, params):
        self.params = params
        self.components = {c: None for c in params.tree_components}
        self.page_size = params.page_size
        self.linker = None

    def init_cache_linker(self, linker):
        self.linker = _Wrapper(self, linker)
