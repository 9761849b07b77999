"""The MLA host pool contract: python/sglang/srt/mem_cache/pool_host/mla.py
at c76318764f51e77e13f6f37ce271232485a8708c, MLATokenToKVPoolHost (its
constructor, with override_kv_cache_dim as the ninth parameter, and
get_contiguous_buf_infos). hiradix_cache.py @39baee9e builds it with
host_page_num= as a keyword. Signatures only (see base.py)."""
from typing import Optional

from .base import Call, HostKVCache


class MLATokenToKVPoolHost(HostKVCache):
    def __init__(self, device_pool, host_to_device_ratio: float, host_size: int,
                 page_size: int, layout: str, pin_memory: bool = True, device: str = "cpu",
                 allocator_type: str = "default", override_kv_cache_dim: Optional[int] = None):
        raise NotImplementedError("the stand-in declares the contract only")

    def get_contiguous_buf_infos(self):
        raise NotImplementedError()


CALLS = (
    Call("get_contiguous_buf_infos", (), {},
         "pool_host/mla.py@c7631876 (disaggregation transfer engine registration)"),
)
