"""What the SGLang-class tests compare against, written from REFERENCE.md
(not from SGLang's code):

- DevicePool: SGLang's device pool as its host pool sees it (per-layer
  k_buffer/v_buffer, MLA kv_buffer, of (size + page_size) rows), here in
  hostkv.torch shm tensors as the CPU backend needs.
- HostModel: SGLang's host pool semantics by plain indexing, one token and
  one layer at a time: where each (token, layer) row lands for each layout,
  and which bytes get_page_buffer_meta must point at.
- InProcessHostPool: SGLang's own (in-process) host pool as a storage
  backend sees it, on HostModel's buffer.
- page_keys: SGLang's storage keys of a token sequence (get_hash_str,
  chained; checked against SGLang's source, see the function).
"""
import hashlib
import threading

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


# -- The storage tier's view of SGLang ------------------------------------------

def page_keys(token_ids, page_size, prior_hash=None):
    """SGLang's storage keys of `token_ids`, one per whole page: its
    get_hash_str(page_tokens, prior_hash) chained page to page (SHA-256 over
    the prior key's 32 bytes, then each token id as 4 bytes little-endian;
    the hex digest), as mem_cache/hicache_storage.py (later
    mem_cache/utils.py) and the controller's get_hash_list compute them."""
    keys = []
    prior = prior_hash
    for start in range(0, len(token_ids) - len(token_ids) % page_size, page_size):
        hasher = hashlib.sha256()
        if prior:
            hasher.update(bytes.fromhex(prior))
        for t in token_ids[start:start + page_size]:
            hasher.update(int(t).to_bytes(4, byteorder="little", signed=False))
        prior = hasher.hexdigest()
        keys.append(prior)
    return keys


class InProcessHostPool:
    """SGLang's own MHATokenToKVPoolHost / MLATokenToKVPoolHost as a
    storage backend sees it: a CPU kv_buffer of this process in the
    layout's shape (HostModel's), SGLang's sizing (ratio x device size, plus
    a page), the geometry attributes, page-granular alloc/free, and
    HostModel's backup and load."""

    def __init__(self, device, layout, ratio=2.0):
        ps = device.page_size
        self.page_size, self.layout = ps, layout
        self.dtype = device.store_dtype
        self.layer_num = device.layer_num
        self.start_layer, self.end_layer = 0, device.layer_num - 1
        self.page_num = int(device.size * ratio) // ps + 1
        self.size = self.page_num * ps
        if device.attention == "mha":
            self.head_num, self.head_dim = device.head_num, device.head_dim
            row = (device.head_num, device.head_dim)
        else:
            self.kv_lora_rank = device.kv_lora_rank
            self.qk_rope_head_dim = device.qk_rope_head_dim
            row = (1, device.kv_lora_rank + device.qk_rope_head_dim)
        self.model = HostModel(device.attention, layout, device.layer_num, self.size, ps,
                               row, self.dtype)
        self.kv_buffer = self.model.buf
        self.lock = threading.RLock()
        self._free = list(range(self.page_num))

    def alloc(self, need_size):
        pages = need_size // self.page_size
        with self.lock:
            if pages > len(self._free):
                return None
            taken, self._free = self._free[:pages], self._free[pages:]
        return torch.cat([torch.arange(p * self.page_size, (p + 1) * self.page_size)
                          for p in taken]) if taken else torch.empty(0, dtype=torch.int64)

    def free(self, indices):
        with self.lock:
            self._free += sorted(set(int(i) // self.page_size for i in indices.tolist()))

    def backup_from_device_all_layer(self, device, host_indices, device_indices, io_backend):
        self.model.backup(device, host_indices, device_indices)

    def get_data_page(self, index, flat=True):
        return self.model.page(int(index))

    def get_dummy_flat_data_page(self):
        return torch.zeros_like(self.model.page(0))

    def page_bytes(self, host_indices):
        """The bytes of the pages of `host_indices`, page by page."""
        return [_bytes(self.model.page(int(i)))
                for i in host_indices[::self.page_size].tolist()]
