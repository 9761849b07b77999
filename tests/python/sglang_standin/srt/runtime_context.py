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
