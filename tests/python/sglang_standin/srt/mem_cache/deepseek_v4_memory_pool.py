"""Stand-in of python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py:
only the class name managers/cache_controller.py @001067ff tests with
isinstance (rank-replicated KV, like MLA)."""
from .memory_pool import KVCache


class DeepSeekV4TokenToKVPool(KVCache):
    pass
