"""Stand-in of python/sglang/srt/mem_cache/pool_host (SGLang's host KV
pools), here only their contract: base.py (pool_host/base.py at 39baee9e
and 086fe1aa), mha.py (at 39baee9e), mla.py (at c7631876)."""
from .base import HostKVCache

__all__ = ["HostKVCache"]
