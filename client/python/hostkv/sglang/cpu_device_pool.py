"""SGLang-shaped device pools on the CPU backend, for engines' tests and
demos without a GPU: per-layer KV tensors of (size + page_size) rows, as
SGLang's MHATokenToKVPool / MLATokenToKVPool have them, in one
hostkv.torch.shm_tensor (sealed shared memory hostkvd can import).
"""
from .. import torch as hostkv_torch


class _CpuDevicePool:
    def __init__(self, size, page_size, layer_num, dtype):
        self.size = size
        self.page_size = page_size
        self.layer_num = layer_num
        self.dtype = self.store_dtype = dtype
        self.start_layer, self.end_layer = 0, layer_num - 1
        self.device = "cpu"


class CpuMHATokenToKVPool(_CpuDevicePool):
    """k_buffer[l], v_buffer[l]: (size + page_size, head_num, head_dim)."""

    def __init__(self, size, page_size, head_num, head_dim, layer_num, dtype):
        super().__init__(size, page_size, layer_num, dtype)
        self.head_num, self.head_dim = head_num, head_dim
        self.kv, self.k_buffer, self.v_buffer = hostkv_torch.mha_kv_buffer(
            layer_num, size + page_size, head_num, head_dim, dtype)


class CpuMLATokenToKVPool(_CpuDevicePool):
    """kv_buffer[l]: (size + page_size, 1, kv_lora_rank + qk_rope_head_dim)."""

    def __init__(self, size, page_size, kv_lora_rank, qk_rope_head_dim, layer_num, dtype):
        super().__init__(size, page_size, layer_num, dtype)
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.kv, self.kv_buffer = hostkv_torch.mla_kv_buffer(
            layer_num, size + page_size, kv_lora_rank + qk_rope_head_dim, dtype)
