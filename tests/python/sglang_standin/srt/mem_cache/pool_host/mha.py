"""The MHA host pool contract: python/sglang/srt/mem_cache/pool_host/mha.py
at 39baee9e09735ebb7916f64ceb00dbfe395ab52b, MHATokenToKVPoolHost (its
constructor's defaults, get_split_heads_page_buffer_meta) and
get_mha_host_pool_cls. Signatures only (see base.py)."""
from typing import Optional

from .base import Call, HostKVCache


class MHATokenToKVPoolHost(HostKVCache):
    def __init__(self, device_pool, host_to_device_ratio: float, host_size: int,
                 page_size: int, layout: str, pin_memory: bool = True, device: str = "cpu",
                 allocator_type: str = "default", host_page_num: Optional[int] = None):
        raise NotImplementedError("the stand-in declares the contract only")

    def get_split_heads_page_buffer_meta(self, indices, split_factor):
        raise NotImplementedError()


class AsymmetricMHATokenToKVPoolHost(MHATokenToKVPoolHost):
    """For head_dim != v_head_dim (same constructor)."""


def get_mha_host_pool_cls(device_pool, mha_cls=MHATokenToKVPoolHost,
                          asymmetric_cls=AsymmetricMHATokenToKVPoolHost):
    """SGLang returns its module's two classes; the stand-in takes the
    classes to choose from (a test passes the drop-ins, as install() rebinds
    the module's MHATokenToKVPoolHost)."""
    if device_pool.head_dim != device_pool.v_head_dim:
        return asymmetric_cls
    return mha_cls


CALLS = (
    Call("get_split_heads_page_buffer_meta", ("indices", "split_factor"), {},
         "storage backends with should_split_heads (page_head)"),
)
