"""What the SGLang-class tests compare against, written from REFERENCE.md
(not from SGLang's code):

- DevicePool: SGLang's device pool as its host pool sees it (per-layer
  k_buffer/v_buffer, MLA kv_buffer, of (size + page_size) rows), here in
  hostkv.torch shm tensors as the CPU backend needs.
- HostModel: SGLang's host pool semantics by plain indexing, one token and
  one layer at a time: where each (token, layer) row lands for each layout,
  and which bytes get_page_buffer_meta must point at.
"""
import torch

import hostkv.torch as hkt


class DevicePool:
    """MHATokenToKVPool / MLATokenToKVPool as far as a host pool reads them."""

    def __init__(self, attention, layer_num, size, page_size, dtype=torch.bfloat16,
                 head_num=2, head_dim=8, kv_lora_rank=16, qk_rope_head_dim=8):
        self.attention = attention
        self.layer_num = layer_num
        self.size = size
        self.page_size = page_size
        self.store_dtype = dtype
        self.dtype = dtype
        self.start_layer, self.end_layer = 0, layer_num - 1
        self.device = "cpu"
        rows = size + page_size
        if attention == "mha":
            self.head_num, self.head_dim = head_num, head_dim
            self.kv, self.k_buffer, self.v_buffer = hkt.mha_kv_buffer(
                layer_num, rows, head_num, head_dim, dtype)
        else:
            self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
            self.kv, self.kv_buffer = hkt.mla_kv_buffer(
                layer_num, rows, kv_lora_rank + qk_rope_head_dim, dtype)

    def planes(self):
        """Per plane (K, V; MLA: the latent) the per-layer tensors."""
        if self.attention == "mha":
            return [self.k_buffer, self.v_buffer]
        return [self.kv_buffer]

    def fill_random(self, generator):
        for layers in self.planes():
            for t in layers:
                t.copy_(torch.randn(t.shape, generator=generator).to(t.dtype))

    def zero(self):
        self.kv.zero_()


class HostModel:
    """SGLang's host kv_buffer for one layout, moved token by token."""

    def __init__(self, attention, layout, layer_num, size, page_size, row_shape, dtype):
        self.attention, self.layout = attention, layout
        self.L, self.size, self.ps = layer_num, size, page_size
        self.row_shape = row_shape  # (H, D) for MHA, (1, kv_dim) for MLA
        self.dtype = dtype
        P, L, ps = size // page_size, layer_num, page_size
        if attention == "mha":
            H, D = row_shape
            shape = {"layer_first": (2, L, size, H, D), "page_first": (2, size, L, H, D),
                     "page_first_direct": (2, P, L, ps, H, D),
                     "page_head": (2, P, H, ps, L, D)}[layout]
        else:
            kv_dim = row_shape[1]
            shape = {"layer_first": (L, size, 1, kv_dim), "page_first": (size, L, 1, kv_dim),
                     "page_first_direct": (P, L, ps, 1, kv_dim)}[layout]
        self.buf = torch.zeros(shape, dtype=dtype)

    def _plane(self, plane):
        return self.buf[plane] if self.attention == "mha" else self.buf

    def row(self, plane, layer, token):
        """The host row of (token, layer): a view shaped row_shape."""
        b, ps = self._plane(plane), self.ps
        if self.layout == "layer_first":
            return b[layer, token]
        if self.layout == "page_first":
            return b[token, layer]
        if self.layout == "page_first_direct":
            return b[token // ps, layer, token % ps]
        return b[token // ps, :, token % ps, layer]  # page_head: (H, D)

    def backup(self, device, host_indices, device_indices):
        for plane, layers in enumerate(device.planes()):
            for layer in range(self.L):
                for h, d in zip(host_indices.tolist(), device_indices.tolist()):
                    self.row(plane, layer, h).copy_(layers[layer][d])

    def expected_device(self, device, host_indices, device_indices):
        """The device pool's planes after loading host_indices -> device_indices."""
        planes = [[t.clone() for t in layers] for layers in device.planes()]
        for plane, layers in enumerate(planes):
            for layer in range(self.L):
                for h, d in zip(host_indices.tolist(), device_indices.tolist()):
                    layers[layer][d].copy_(self.row(plane, layer, h))
        return planes

    def page(self, index):
        """The page at slot `index` in the layout's axis order (flat)."""
        ps, p = self.ps, index // self.ps
        b = self.buf
        mha = self.attention == "mha"
        if self.layout == "layer_first":
            page = b[:, :, index:index + ps] if mha else b[:, index:index + ps]
        elif self.layout == "page_first":
            page = b[:, index:index + ps] if mha else b[index:index + ps]
        else:
            page = b[:, p:p + 1] if mha else b[p:p + 1]
        return page.flatten()

    def meta_bytes(self, page_starts):
        """The bytes get_page_buffer_meta's pieces must hold, in order: per
        page, per layer K then V (layer_first), else K then V of all layers
        (MLA: one piece)."""
        pieces = []
        planes = 2 if self.attention == "mha" else 1
        for index in page_starts:
            tokens = range(index, index + self.ps)
            if self.layout == "layer_first":
                for layer in range(self.L):
                    for plane in range(planes):
                        pieces.append(b"".join(_bytes(self.row(plane, layer, t))
                                               for t in tokens))
            else:
                for plane in range(planes):
                    pieces.append(_bytes(self._page_block(plane, index)))
        return pieces

    def _page_block(self, plane, index):
        """One plane of one page as stored (contiguous in every non-layer_first
        layout): the bytes from its first row to its last."""
        b, ps, p = self._plane(plane), self.ps, index // self.ps
        if self.layout == "page_first":
            return b[index:index + ps]
        return b[p]


def _bytes(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes()
