"""Stand-in of python/sglang/srt/mem_cache/storage (its __init__ exports
StorageBackendFactory, which cache_controller.py @001067ff imports)."""
from .backend_factory import StorageBackendFactory  # noqa: F401
__all__ = ["StorageBackendFactory"]
