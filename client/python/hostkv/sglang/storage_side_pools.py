"""The pools of hybrid models beside the KV (SGLang's PoolName: mamba,
swa, indexer, ...) in hostkvd's page cache, for HostkvStorage's v2 calls.

SGLang registers each with register_mem_host_pool_v2(host_pool, name) and
moves its pages by flat page (get_data_page / get_dummy_flat_data_page /
set_from_flat_data_page, as its own file backend does). A SidePool keeps
them in a hostkvd pool of its own whose pages are one such flat page of
bytes each (an fp8 "MLA" geometry of one token per page: hostkvd moves
bytes), named after the KV pool and the pool name, mapped here, under the
same namespace and keys as the KV pages. Errors: hostkv.errors.
"""
import re

from .. import cache_calls, errors, mla_pool_spec

_MAX_ROW = 65536   # hostkvd's largest latent row (kMaxHeadDim)
_MAX_LAYERS = 4096
_POOL_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def _torch():
    import torch  # pylint: disable=import-outside-toplevel
    return torch


def _row_layers(page_bytes):
    """(layers, row) with layers * row == page_bytes and row <= _MAX_ROW."""
    for layers in range(max(1, -(-page_bytes // _MAX_ROW)), _MAX_LAYERS + 1):
        if page_bytes % layers == 0 and page_bytes // layers <= _MAX_ROW:
            return layers, page_bytes // layers
    raise errors.InvalidArgument(
        f"a flat page of {page_bytes} bytes does not fit a hostkvd pool page")


def side_pool_name(kv_pool_name, pool):
    name = _POOL_CHARS.sub("_", f"{kv_pool_name}.{pool}")
    return name if len(name) <= 64 else name[:64]


class SidePool:
    """One registered extra pool: `host_pool` (SGLang's) and the hostkvd
    pool its pages are cached in, over `client` (the storage's session)."""

    def __init__(self, client, host_pool, name):
        torch = _torch()
        self.client = client
        self.host_pool = host_pool
        self.page_size = 1  # one flat page of the host pool per hostkvd page
        sample = host_pool.get_dummy_flat_data_page()
        self.dtype = sample.dtype
        self.page_bytes = sample.numel() * sample.element_size()
        layers, row = _row_layers(self.page_bytes)
        pages = max(1, int(host_pool.size) // int(host_pool.page_size))
        spec = mla_pool_spec(name, layers, row, 0, 1, dtype="fp8_e4m3",
                             layout="page_first", capacity_tokens=pages, kv_cache_dim=row)
        self.pool_name = spec.name
        try:
            self.pool = client.create_pool(spec, attach_if_exists=True)
        except errors.AlreadyExists as e:
            raise ValueError(f"HostkvStorage: hostkvd pool {name} exists with another "
                             f"spec ({e.message})") from None
        mapping = client.map_pool(self.pool_name)
        if not mapping.writable:
            raise errors.PermissionDenied(
                f"pool {self.pool_name} is mapped read-only: it belongs to another user")
        self._bytes = mapping.tensor()[:self.pool.total_bytes].view(
            -1, self.page_bytes)
        self._mapping = mapping
        del torch

    def store(self, host_pages):
        """New hostkvd pages holding copies of the host pool's pages that
        start at slots `host_pages`; returns their runs."""
        runs = self.client.alloc(self.pool_name, len(host_pages))
        try:
            for page, index in zip(cache_calls.page_list(runs), host_pages):
                flat = self.host_pool.get_data_page(index, flat=True)
                self._bytes[page].copy_(flat.contiguous().view(-1).view(_torch().uint8))
        except BaseException:
            self.client.free(self.pool_name, runs)
            raise
        return runs

    def load(self, cached_runs, host_pages):
        """Copies cached pages into the host pool's pages at `host_pages`."""
        for page, index in zip(cache_calls.page_list(cached_runs), host_pages):
            data = self._bytes[page].clone().view(self.dtype)
            self.host_pool.set_from_flat_data_page(index, data)
