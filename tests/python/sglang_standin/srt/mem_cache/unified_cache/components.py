"""Stand-in of the ComponentType of python/sglang/srt/mem_cache/unified_cache/
components.py as unified_cache_linker.py @03205d15 uses it: the tree
components a linker is built for (the wrapper takes FULL and SWA only)."""
import enum


class ComponentType(enum.IntEnum):
    FULL = 0
    SWA = 1
    MAMBA = 2
