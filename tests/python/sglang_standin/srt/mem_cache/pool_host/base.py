"""The host KV pool contract: SGLang's HostKVCache as the rest of SGLang
calls it, modelled on python/sglang/srt/mem_cache/pool_host/base.py at
39baee9e09735ebb7916f64ceb00dbfe395ab52b (constructor with host_page_num,
sizing, alloc/free, destroy, is_stride_page_aligned) and at
086fe1aa9c2904630c17e0fb58f6202633455609 (load_to_device_per_layer's
keyword-only is_draft, prepare_transfer_indices, the *_physical calls and
their defaults), which the L2 engines of mem_cache/l2_transfer.py @67e863cd
/ @086fe1aa call.

HostKVCache here is not a host pool: it declares the signatures (so a test
can inspect a drop-in against them) and implements the defaults the
086fe1aa engine relies on. CALLS lists each call SGLang makes on a host
pool, with who makes it; ATTRIBUTES what it reads. shared_host_layout_domains
is the helper l2_transfer.py @086fe1aa imports from base.py.
"""
import abc
from typing import NamedTuple, Optional


class HostKVCache(abc.ABC):
    # Class attributes of the newer base.py (dcp); getattr'd by the engine.
    dcp_size = 1
    dcp_rank = 0
    # A pool that shares its page layout with others names the domain here
    # (compacting pools); plain pools have none.
    shared_allocation_domain = None

    def __init__(self, device_pool, host_to_device_ratio: float, host_size: int,
                 page_size: int, layout: str, pin_memory: bool, device: str,
                 allocator_type: str = "default", host_page_num: Optional[int] = None):
        raise NotImplementedError("the stand-in declares the contract only")

    @abc.abstractmethod
    def get_size_per_token(self):
        raise NotImplementedError()

    @abc.abstractmethod
    def init_kv_buffer(self):
        raise NotImplementedError()

    @abc.abstractmethod
    def load_to_device_per_layer(self, device_pool, host_indices, device_indices, layer_id,
                                 io_backend, *, is_draft: bool = False) -> None:
        raise NotImplementedError()

    @abc.abstractmethod
    def backup_from_device_all_layer(self, device_pool, host_indices, device_indices,
                                     io_backend) -> None:
        raise NotImplementedError()

    @abc.abstractmethod
    def get_data_page(self, index, flat: bool = True):
        raise NotImplementedError()

    @abc.abstractmethod
    def get_dummy_flat_data_page(self):
        raise NotImplementedError()

    @abc.abstractmethod
    def set_from_flat_data_page(self, index: int, data_page) -> None:
        raise NotImplementedError()

    # -- defaults of base.py @086fe1aa (what a plain pool inherits) ----------

    def prepare_transfer_indices(self, host_indices, device_indices, io_backend):
        """A plain pool's indices are physical already (the controller moved
        them where the io_backend wants them): unchanged."""
        return host_indices, device_indices

    def backup_from_device_all_layer_physical(self, device_pool, host_indices,
                                              device_indices, io_backend):
        self.backup_from_device_all_layer(device_pool, host_indices, device_indices,
                                          io_backend)

    def load_to_device_per_layer_physical(self, device_pool, host_indices, device_indices,
                                          layer_id, io_backend, *, is_draft: bool = False):
        self.load_to_device_per_layer(device_pool, host_indices, device_indices, layer_id,
                                      io_backend, is_draft=is_draft)

    # -- concrete in base.py @39baee9e (signatures) ------------------------------

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        return False

    def destroy(self):
        """Idempotent: releases (unpins) the host buffer."""

    def clear(self):
        raise NotImplementedError()

    def available_size(self):
        raise NotImplementedError()

    def alloc(self, need_size: int):
        raise NotImplementedError()

    def free(self, indices) -> int:
        raise NotImplementedError()


def shared_host_layout_domains(host_pools):
    """The distinct shared_allocation_domain of the HostKVCache pools among
    host_pools that have one, in first-seen order (usually none)."""
    domains = []
    for pool in host_pools:
        if not isinstance(pool, HostKVCache):
            continue
        domain = getattr(pool, "shared_allocation_domain", None)
        if domain is not None and all(domain is not d for d in domains):
            domains.append(domain)
    return domains


class Call(NamedTuple):
    """One call SGLang makes on a host pool: method, the positional
    arguments (by name), the keywords (with the value passed), the caller."""
    method: str
    args: tuple
    kwargs: dict
    caller: str


_CC = "managers/cache_controller.py@001067ff"
_HIRADIX = "mem_cache/hiradix_cache.py@39baee9e"
_L2_OLD = "mem_cache/l2_transfer.py@67e863cd"
_L2_NEW = "mem_cache/l2_transfer.py@086fe1aa"
_MOVE = ("device_pool", "host_indices", "device_indices")

CALLS = (
    Call("alloc", ("need_size",), {}, f"{_CC} write(); {_HIRADIX} prefetch_from_storage"),
    Call("free", ("indices",), {}, f"{_CC} evict_host(); {_HIRADIX} drain/prefetch"),
    Call("available_size", (), {}, f"{_HIRADIX} prefetch_from_storage; {_CC} rate limit"),
    Call("clear", (), {}, f"{_HIRADIX} reset()"),
    Call("backup_from_device_all_layer", _MOVE + ("io_backend",), {},
         f"{_L2_OLD} submit_device_to_host"),
    Call("load_to_device_per_layer", _MOVE + ("layer_id", "io_backend"), {"is_draft": False},
         f"{_L2_OLD} submit_host_to_device"),
    Call("load_to_device_per_layer", _MOVE + ("layer_id", "io_backend"), {"is_draft": True},
         "mem_cache/hybrid_cache/hybrid_cache_controller.py@00343773 draft transfers"),
    Call("prepare_transfer_indices", ("host_indices", "device_indices", "io_backend"), {},
         f"{_L2_NEW} _prepare_transfers"),
    Call("backup_from_device_all_layer_physical", _MOVE + ("io_backend",), {},
         f"{_L2_NEW} submit_device_to_host"),
    Call("load_to_device_per_layer_physical", _MOVE + ("layer_id", "io_backend"),
         {"is_draft": False}, f"{_L2_NEW} submit_host_to_device"),
    Call("get_data_page", ("index",), {}, f"{_CC} _generic_page_set"),
    Call("get_data_page", ("index",), {"flat": True}, "hicache_storage.py@001067ff HiCacheFile v2"),
    Call("get_dummy_flat_data_page", (), {}, f"{_CC} _generic_page_get; {_HIRADIX} hit query"),
    Call("set_from_flat_data_page", ("index", "data_page"), {}, f"{_CC} _generic_page_get"),
    Call("get_page_buffer_meta", ("indices",), {},
         "zero-copy backends (storage/kvcc/kvcc_store.py@001067ff, mooncake)"),
    Call("get_size_per_token", (), {}, "storage/backend_factory.py@001067ff (hf3fs)"),
    Call("get_ksize_per_token", (), {}, "storage/backend_factory.py@001067ff (hf3fs)"),
    Call("is_stride_page_aligned", (), {}, "pool_host/base.py@39baee9e (NIXL O_DIRECT)"),
    Call("is_stride_page_aligned", ("page_size_bytes",), {}, "pool_host/base.py@39baee9e"),
    Call("destroy", (), {}, "pool_host/base.py@39baee9e"),
)

# What SGLang reads off a host pool (the controller, the engines, the
# storage backends and the factory, the tree cache).
ATTRIBUTES = {
    "size": f"{_CC} prefetch_capacity_limit",
    "page_size": f"{_CC} append_host_mem_release; backends",
    "page_num": "pool_host/mha.py@39baee9e (MHATokenToKOnlyPoolHost sizes by its anchor)",
    "layout": f"{_CC} move_indices, storage config",
    "dtype": "storage/backend_factory.py@001067ff (hf3fs)",
    "size_per_token": f"{_CC} _transfer_num_bytes",
    "layer_num": f"{_L2_OLD} (non-primary transfers)",
    "kv_buffer": "storage/kvcc/kvcc_store.py@001067ff, mooncake register_mem_pool_host",
    "can_use_write_back_jit": f"{_CC} _move_write_operation (getattr)",
    "start_layer": "pool_host/base.py@39baee9e",
    "end_layer": "pool_host/base.py@39baee9e",
}
