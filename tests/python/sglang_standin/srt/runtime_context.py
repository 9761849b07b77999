"""Stand-in of python/sglang/srt/runtime_context.get_parallel() as
managers/cache_controller.py @001067ff (_generate_storage_config) reads
it: tp_rank / tp_size, attn_tp_rank / attn_tp_size, pp_rank / pp_size.
One process here: rank 0 of 1 everywhere, unless a test sets others with
set_parallel() (stand-in only)."""
import dataclasses


@dataclasses.dataclass
class ParallelState:
    tp_rank: int = 0
    tp_size: int = 1
    attn_tp_rank: int = 0
    attn_tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    nnodes: int = 1


_state = ParallelState()


def get_parallel():
    return _state


def set_parallel(**fields):
    """Stand-in only: changes the ranks get_parallel() reports; returns the
    previous values (for a test to restore)."""
    previous = {name: getattr(_state, name) for name in fields}
    for name, value in fields.items():
        setattr(_state, name, value)
    return previous


@dataclasses.dataclass
class MemoryState:
    """get_memory() as unified_cache/linker_factory.py @2c62dc66 reads it."""
    enable_unified_cache_external_linker: bool = False
    unified_cache_external_linker_config: object = None  # a dict (argparse's JSON)
    unified_cache_external_linker_backend: str = "mooncake"
    radix_cache_backend: object = None  # --radix-cache-backend (mem_cache/registry.py)
    hicache_host_memory_mode: str = "cache"  # --hicache-host-memory-mode: cache | buffer_only


_memory = MemoryState()


def get_memory():
    return _memory


def set_memory(**fields):
    """Stand-in only: sets what get_memory() reports; returns the previous values."""
    previous = {name: getattr(_memory, name) for name in fields}
    for name, value in fields.items():
        setattr(_memory, name, value)
    return previous
