"""How HostkvStorage moves page bytes between SGLang's host pool and the
hostkvd pool whose pages it publishes. Two paths, picked by the host pool:

- LocalPoolPath: SGLang's own in-process host pool (MHATokenToKVPoolHost /
  MLATokenToKVPoolHost: kv_buffer is a CPU tensor of this process). The
  storage holds a hostkvd pool of the same geometry, layout and page size
  (its own session, a named pool that outlives the engine), maps it
  (zero copy, writable: the pool is this uid's) and copies pages with torch
  between the two buffers. No page byte goes over gRPC.
- RemotePoolPath: hostkv.sglang's remote host pool, whose pages already
  live in a hostkvd pool: CopyPages inside the daemon, on the host pool's
  own session (which owns the engine's pages).

Both give: client, pool_name, page_size, store(engine_pages) -> runs of new
pages holding copies (the caller publishes or frees them), load(cached
runs, engine_pages), and kv (the hostkvd pool's pages as SGLang's
kv_buffer, or None) for the flat-page calls. Errors: hostkv.errors.
"""
import logging

from .. import cache_calls, errors, mha_pool_spec, mla_pool_spec
from .. import client as client_module
from . import page_copy, storage_names
from .remote_pool import _DTYPE_NAMES, RemoteHostKVCache

_log = logging.getLogger("hostkv.sglang.storage")
COPY_CALL_BYTES = 256 << 20


def is_mha(host_pool):
    """MHA unless the pool has MLA's latent geometry."""
    return not hasattr(host_pool, "kv_lora_rank")


class RemotePoolPath:
    """The engine's pages live in hostkvd already (a RemoteHostKVCache)."""

    def __init__(self, host_pool):
        self.host_pool = host_pool
        self.client = host_pool.client
        self.pool_name = host_pool.pool_name
        self.page_size = host_pool.page_size
        self.layout = host_pool.layout
        self.mha = is_mha(host_pool)
        self.kv = host_pool.kv_buffer  # None over TCP: flat-page calls unavailable
        if host_pool.pool.owner.delete_with_session:
            _log.warning("hostkv storage: host pool %s is private (deleted with the "
                         "engine's session): its cached pages go with it; name the pool "
                         "(pool_name=) for them to outlive the engine", self.pool_name)

    def store(self, engine_pages):
        runs = self.client.alloc(self.pool_name, len(engine_pages) * self.page_size)
        try:
            self._copy(engine_pages, cache_calls.page_list(runs))
        except BaseException:
            self.client.free(self.pool_name, runs)
            raise
        return runs

    def load(self, cached_runs, engine_pages):
        self._copy(cache_calls.page_list(cached_runs), engine_pages)

    def _copy(self, from_pages, to_pages):
        """CopyPages in calls of at most COPY_CALL_BYTES (hostkvd refuses a
        call over --max_copy_bytes, 1 GiB by default; SGLang's batches of
        128 pages can be more)."""
        per_call = max(1, COPY_CALL_BYTES // max(1, self.host_pool.pool.page_bytes))
        for start in range(0, len(from_pages), per_call):
            self.client.copy_pages(self.pool_name,
                                   cache_calls.page_runs(from_pages[start:start + per_call]),
                                   cache_calls.page_runs(to_pages[start:start + per_call]))

    def close(self):
        pass  # the session is the host pool's


class LocalPoolPath:
    """The engine's pages are in this process; the cache's in a hostkvd
    pool of the same shape, mapped here. Owns its session (close())."""

    def __init__(self, host_pool, target, client_name, auth_token, pool_name=None,
                 pool_tokens=None):
        self.host_pool = host_pool
        self.page_size = host_pool.page_size
        self.layout = host_pool.layout
        self.mha = is_mha(host_pool)
        if getattr(host_pool, "kv_buffer", None) is None:
            raise ValueError("HostkvStorage: the host pool has no kv_buffer to copy from")
        dtype = _DTYPE_NAMES.get(str(host_pool.dtype).replace("torch.", ""))
        if dtype is None:
            raise ValueError(f"HostkvStorage: hostkv has no pool dtype for {host_pool.dtype}")
        spec = self._spec(dtype, pool_name, pool_tokens or host_pool.size)
        self.pool_name = spec.name
        self._args = (host_pool, target, client_name, auth_token, pool_name, pool_tokens)
        # The storage never waits for hostkvd: while it is away, calls fail at
        # once and HostkvStorage answers misses.
        self.client = client_module.Client(target, client_name, auth_token=auth_token,
                                           reconnect_timeout=0)
        try:
            self._open(spec)
        except BaseException:
            self.client.close()
            raise

    def _spec(self, dtype, pool_name, tokens):
        p = self.host_pool
        if self.mha:
            dims = (p.layer_num, p.head_num, p.head_dim)
            make = mha_pool_spec
        else:
            dims = (p.layer_num, p.kv_lora_rank, p.qk_rope_head_dim)
            make = mla_pool_spec
        extra, named = {}, dims
        row = getattr(p, "kv_cache_dim", None)
        if not self.mha and row and row != p.kv_lora_rank + p.qk_rope_head_dim:
            extra["kv_cache_dim"] = row  # SGLang's override_kv_cache_dim
            named = dims + (row,)
        name = pool_name or storage_names.derived_pool_name(
            "mha" if self.mha else "mla", named, dtype, self.layout, self.page_size)
        return make(name, *dims, self.page_size, dtype=dtype, layout=self.layout,
                    capacity_tokens=int(tokens), **extra)

    def _open(self, spec):
        try:
            self.pool = self.client.create_pool(spec, attach_if_exists=True)
        except errors.AlreadyExists as e:
            raise ValueError(
                f"HostkvStorage: hostkvd pool {spec.name} exists with another spec "
                f"({e.message}); set \"pool_name\" (or the same \"pool_tokens\") in "
                f"the extra config") from None
        mapping = self.client.map_pool(spec.name)
        if not mapping.writable:
            raise errors.PermissionDenied(
                f"pool {spec.name} is mapped read-only: it belongs to another user")
        self.kv = mapping.kv_buffer(dtype=self.host_pool.kv_buffer.dtype)
        page_copy.check_same_pages(self.kv, self.host_pool.kv_buffer, self.layout, self.mha)

    def store(self, engine_pages):
        runs = self.client.alloc(self.pool_name, len(engine_pages) * self.page_size)
        try:
            page_copy.copy_pages(self.kv, cache_calls.page_list(runs),
                                 self.host_pool.kv_buffer, engine_pages, self.layout,
                                 self.mha, self.page_size)
        except BaseException:
            self.client.free(self.pool_name, runs)
            raise
        return runs

    def load(self, cached_runs, engine_pages):
        page_copy.copy_pages(self.host_pool.kv_buffer, engine_pages, self.kv,
                             cache_calls.page_list(cached_runs), self.layout, self.mha,
                             self.page_size)

    def reopen(self):
        """A new path like this one: a new session, the pool created again
        if the daemon no longer has it (a restart), mapped again."""
        return LocalPoolPath(*self._args)

    def close(self):
        self.client.close()


def path_for(host_pool, target, client_name, auth_token, pool_name=None, pool_tokens=None):
    """The path for `host_pool` (SGLang's in-process pool or a remote one)."""
    if isinstance(host_pool, RemoteHostKVCache):
        return RemotePoolPath(host_pool)
    return LocalPoolPath(host_pool, target, client_name, auth_token, pool_name, pool_tokens)
