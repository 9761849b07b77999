"""SGLang's host KV pools (MHATokenToKVPoolHost, MLATokenToKVPoolHost)
served by hostkvd: the classes install() puts where SGLang's code names
its own (remote_pool.py has what they share).

    host_pool = RemoteMHATokenToKVPoolHost(device_pool, 2.0, 0, 16, "layer_first")
    idx = host_pool.alloc(64)                        # int64 token indices
    host_pool.backup_from_device_all_layer(device_pool, idx, dev_idx, "kernel")
    for i in range(host_pool.layer_num):
        host_pool.load_to_device_per_layer(device_pool, idx, dev_idx, i, "kernel")

Modelled on SGLang's pool_host/mha.py at 39baee9e and pool_host/mla.py at
c7631876: the constructors' ninth positional parameter is MHA's
host_page_num and MLA's override_kv_cache_dim (the latent row width of
DSA/NSA models). A device pool with head_dim != v_head_dim (SGLang's
AsymmetricMHATokenToKVPoolHost) is refused: hostkvd pools have one head
width for K and V.
"""
from .. import mha_pool_spec, mla_pool_spec
from .remote_pool import _DTYPE_NAMES, RemoteHostKVCache, _itemsize  # noqa: F401


def _torch():
    import torch  # pylint: disable=import-outside-toplevel
    return torch


class RemoteMHATokenToKVPoolHost(RemoteHostKVCache):
    """SGLang's MHATokenToKVPoolHost on hostkvd."""

    kind = "mha"
    layouts = ("layer_first", "page_first", "page_first_direct", "page_head")
    positional_extras = ("host_page_num",)
    _planes = 2

    def get_size_per_token(self):
        self.head_num = self.device_pool.head_num
        self.head_dim = self.device_pool.head_dim
        self.layer_num = self.device_pool.layer_num
        v_head_dim = getattr(self.device_pool, "v_head_dim", self.head_dim)
        if v_head_dim != self.head_dim:
            raise NotImplementedError(
                f"head_dim {self.head_dim} != v_head_dim {v_head_dim}: hostkv pools "
                "have one head width for K and V; keep SGLang's in-process host pool "
                "(AsymmetricMHATokenToKVPoolHost) for this model")
        self.element_dim = self.head_num * self.head_dim
        return self.head_dim * self.head_num * self.layer_num * _itemsize(self.dtype) * 2

    def get_ksize_per_token(self):
        return self.get_size_per_token() // 2

    @property
    def k_buffer(self):
        return None if self.kv_buffer is None else self.kv_buffer[0]

    @property
    def v_buffer(self):
        return None if self.kv_buffer is None else self.kv_buffer[1]

    def get_split_heads_page_buffer_meta(self, indices, split_factor):
        """page_head only: per page, per group of head_num // split_factor
        heads, a K then a V piece (SGLang's pointer order and sizes)."""
        assert self.layout == "page_head"
        assert self.head_num % split_factor == 0
        base = self._mapped_address("zero-copy page buffers")
        isz = _itemsize(self.dtype)
        L, H, D, ps = self.layer_num, self.head_num, self.head_dim, self.page_size
        group = H // split_factor
        ptrs = []
        for start in self._page_starts(indices, "get_split_heads_page_buffer_meta"):
            for head in range(0, H, group):
                k = base + start * L * H * D * isz + head * ps * L * D * isz
                ptrs += [k, k + self.pool.v_offset]
        return ptrs, [L * isz * ps * H * D // split_factor] * len(ptrs)

    def _pool_spec(self, name, dtype, requested):
        return mha_pool_spec(name, self.layer_num, self.head_num, self.head_dim,
                             self.page_size, dtype=dtype, layout=self.layout,
                             capacity_tokens=requested)

    def _device_layers(self, device_pool):
        return list(device_pool.k_buffer), list(device_pool.v_buffer)

    def _page_shape(self):
        L, H, D, ps = self.layer_num, self.head_num, self.head_dim, self.page_size
        return {"layer_first": (2, L, ps, H, D), "page_first": (2, ps, L, H, D),
                "page_first_direct": (2, 1, L, ps, H, D),
                "page_head": (2, 1, H, ps, L, D)}[self.layout]


class RemoteMLATokenToKVPoolHost(RemoteHostKVCache):
    """SGLang's MLATokenToKVPoolHost on hostkvd."""

    kind = "mla"
    layouts = ("layer_first", "page_first", "page_first_direct")
    positional_extras = ("override_kv_cache_dim",)

    def _configure(self, options):
        self.override_kv_cache_dim = options.get("override_kv_cache_dim")

    def get_size_per_token(self):
        self.kv_lora_rank = self.device_pool.kv_lora_rank
        self.qk_rope_head_dim = self.device_pool.qk_rope_head_dim
        self.layer_num = self.device_pool.layer_num
        self.kv_cache_dim = (self.override_kv_cache_dim
                             or self.kv_lora_rank + self.qk_rope_head_dim)
        return self.kv_cache_dim * _itemsize(self.dtype) * self.layer_num

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def get_contiguous_buf_infos(self):
        """(data_ptrs, data_lens, item_lens) per layer, as SGLang's MLA host
        pool gives them (its kv_buffer[i] and per-layer views)."""
        self._mapped_address("get_contiguous_buf_infos")
        kv = self.kv_buffer
        refs = kv.transpose(0, 1) if self.layout == "page_first" else kv
        ptrs = [refs[i].data_ptr() for i in range(self.layer_num)]
        lens = [kv[i].numel() * kv.element_size() for i in range(self.layer_num)]
        return ptrs, lens, [self.token_stride_size * self.page_size] * self.layer_num

    def _pool_spec(self, name, dtype, requested):
        extra = {}
        if self.kv_cache_dim != self.kv_lora_rank + self.qk_rope_head_dim:
            extra["kv_cache_dim"] = self.kv_cache_dim
        return mla_pool_spec(name, self.layer_num, self.kv_lora_rank,
                             self.qk_rope_head_dim, self.page_size, dtype=dtype,
                             layout=self.layout, capacity_tokens=requested, **extra)

    def _device_layers(self, device_pool):
        return list(device_pool.kv_buffer), []

    def _page_shape(self):
        L, ps = self.layer_num, self.page_size
        return {"layer_first": (L, ps, 1, self.kv_cache_dim),
                "page_first": (ps, L, 1, self.kv_cache_dim),
                "page_first_direct": (1, L, ps, 1, self.kv_cache_dim)}[self.layout]
