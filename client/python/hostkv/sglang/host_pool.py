"""SGLang's host KV pool (HostKVCache) served by hostkvd.

    host_pool = RemoteMHATokenToKVPoolHost(device_pool, 2.0, 0, 16, "layer_first")
    idx = host_pool.alloc(64)                        # int64 token indices
    host_pool.backup_from_device_all_layer(device_pool, idx, dev_idx, "kernel")
    for i in range(host_pool.layer_num):
        host_pool.load_to_device_per_layer(device_pool, idx, dev_idx, i, "kernel")

The constructor is SGLang's; the pages live in a hostkvd pool instead of
this process. Attributes and methods are those SGLang's controller and
storage backends use, with its sizing, its errors and its semantics (see
REFERENCE.md). Per-layer loads: the layer-0 call submits ONE load of every
layer; each call for layer i waits for layer i (CPU: on the session's
signal record; CUDA: the current stream waits on the GPU signal word), so
SGLang's per-layer events keep their meaning.

`layout` defaults to "layer_first", as in SGLang versions that called the
constructor with four arguments; `allocator_type` (SGLang's choice of host
allocator, e.g. for Mooncake) is accepted and ignored: the memory is
hostkvd's. Keywords beyond SGLang's: target= (default $HOSTKV_TARGET, else
unix:/run/hostkv/hostkvd.sock), pool_name= (default: $HOSTKV_POOL, else a
private pool of this object, deleted with its session; a named pool is
attached and outlives the engine, so its cached pages serve the engine's
successor: set HOSTKV_POOL for warm restarts under SGLANG_HOSTKV=1, one
name per model geometry), client_name=, auth_token= (default: the file
$HOSTKV_TOKEN_FILE).
"""
import itertools
import os
import threading

from .. import client as client_module
from .. import errors, mha_pool_spec, mla_pool_spec
from .. import torch as hostkv_torch
from . import indices as idx
from . import page_copy
from .transfer_sync import sync_for

# Which io_backend each layout supports in SGLang (REFERENCE.md).
_IO_BACKENDS = {"layer_first": ("kernel", "direct"), "page_first": ("kernel",),
                "page_first_direct": ("direct",), "page_head": ("kernel",)}
_MECHANISMS = {"kernel": 1, "direct": 2}  # hostkv_pb2.MECHANISM_KERNEL / _DIRECT
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
                "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
                "uint8": "fp8_e4m3"}  # SGLang stores fp8 KV as uint8: bytes alike
_private_pools = itertools.count()


def _torch():
    import torch  # pylint: disable=import-outside-toplevel
    return torch


def _itemsize(dtype):
    """dtype.itemsize (torch >= 2.1 has the attribute, 1.13 does not)."""
    return _torch().empty((), dtype=dtype).element_size()


def _default_token():
    path = os.environ.get("HOSTKV_TOKEN_FILE")
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


class RemoteHostKVCache:
    """What MHA and MLA share: sizing, the pool, allocation, transfers."""

    kind = None          # "mha" / "mla"
    layouts = ()         # the layouts this attention supports

    def __init__(self, device_pool, host_to_device_ratio, host_size, page_size,
                 layout="layer_first", pin_memory=True, device="cpu", *, target=None,
                 pool_name=None,
                 client_name=None, auth_token=None, **kwargs):
        mode = kwargs.get("host_memory_mode", "cache")
        if mode != "cache":
            raise NotImplementedError(
                f"host_memory_mode={mode!r}: hostkv serves the 'cache' mode only")
        self.device_pool = device_pool
        self.page_size = page_size
        self.layout = layout
        self.pin_memory = pin_memory
        self.device = device
        self.dtype = device_pool.store_dtype
        self.size_per_token = self.get_size_per_token()
        if host_size > 0:
            requested = int(host_size * 1e9 // self.size_per_token)
        else:
            requested = int(device_pool.size * host_to_device_ratio)
        self.start_layer = getattr(device_pool, "start_layer", 0)
        self.end_layer = getattr(device_pool, "end_layer", self.layer_num - 1)
        self.page_num = requested // page_size + 1
        self.size = self.page_num * page_size
        assert self.size > device_pool.size, (
            "The host memory should be larger than the device memory with the current "
            "protocol")
        if layout not in self.layouts:
            raise ValueError(f"Unsupported layout: {layout}")
        self.token_stride_size = self.size_per_token // self.layer_num // self._planes
        self.layout_dim = self.token_stride_size * self.layer_num
        self.lock = threading.RLock()
        # Per thread, the all-layer load in progress: [key, op, next layer].
        self._loads = threading.local()

        pool_name = pool_name or os.environ.get("HOSTKV_POOL") or None
        private = pool_name is None
        self.pool_name = pool_name or f"sglang-{self.kind}-{os.getpid()}-{next(_private_pools)}"
        self.client = client_module.Client(
            target or os.environ.get("HOSTKV_TARGET") or client_module.DEFAULT_TARGET,
            client_name or f"sglang-{self.kind}-{os.getpid()}",
            auth_token=auth_token if auth_token is not None else _default_token())
        try:
            self._open_pool(requested, private)
        except BaseException:
            self.client.close()
            raise
        self.clear()

    # -- construction ------------------------------------------------------

    def _open_pool(self, requested, private):
        torch = _torch()
        dtype = _DTYPE_NAMES.get(str(self.dtype).replace("torch.", ""))
        if dtype is None:
            raise ValueError(f"hostkv has no pool dtype for {self.dtype}")
        spec = self._pool_spec(self.pool_name, dtype, requested)
        spec.device_pool_tokens = self.device_pool.size
        try:
            pool = self.client.create_pool(spec, attach_if_exists=True,
                                           delete_with_session=private)
        except errors.ResourceExhausted as e:
            raise ValueError(
                f"Not enough host memory available. Requesting "
                f"{self.size * self.size_per_token / 1e9:.2f} GB from hostkvd, which "
                f"refused: {e.message}. Please reduce the size of the hierarchical "
                f"cache.") from None
        if pool.token_slots != self.size:
            raise errors.Internal(
                f"hostkvd sized pool {self.pool_name} at {pool.token_slots} slots, "
                f"SGLang's sizing gives {self.size}")
        self.pool = pool
        self._mapping = None
        self.kv_buffer = None
        if self.client.has_session_socket:
            self._mapping = self.client.map_pool(self.pool_name)
            self.kv_buffer = self._mapping.kv_buffer(dtype=self.dtype)
        self._held = torch.zeros(self.page_num, dtype=torch.bool)
        self._free_slots = self.size
        k, v = self._device_layers(self.device_pool)
        self._device_slots = int(k[0].shape[0])
        entries_k = [hostkv_torch.describe(self.client, t) for t in k]
        entries_v = [hostkv_torch.describe(self.client, t) for t in v]
        self._sync = sync_for(self.client, k[0], self.layer_num)
        self.import_id = self.client.register_device_buffers(
            self.pool_name, self._device_slots, entries_k, entries_v,
            gpu_signals=self._sync.gpu_signals())
        self._sync.attach(self.import_id)

    def close(self):
        """Ends the session: the daemon frees this pool's pages and imports
        (and deletes a private pool). The engine's process exit does the same."""
        self.client.close()

    # -- allocation (SGLang's HostKVCache) -----------------------------------

    def clear(self):
        """Frees every page this host pool holds."""
        torch = _torch()
        with self.lock:
            held = torch.nonzero(self._held).flatten()
            if held.numel() > 0:
                self.client.free(self.pool_name, idx.runs_of(held))
            self._held.zero_()
            self._free_slots = self.size

    def available_size(self):
        return self._free_slots

    def alloc(self, need_size):
        """need_size token slots (a multiple of page_size) as an int64
        tensor of token indices, or None if fewer are free."""
        assert need_size % self.page_size == 0, (
            "The requested size should be a multiple of the page size.")
        with self.lock:
            if need_size > self._free_slots:
                return None
            if need_size == 0:
                return _torch().empty(0, dtype=_torch().int64)
            try:
                runs = self.client.alloc(self.pool_name, need_size)
            except errors.ResourceExhausted:
                return None  # a shared pool: other sessions took the rest
            for first, count in runs:
                self._held[first:first + count] = True
            self._free_slots -= need_size
            return idx.token_indices(runs, self.page_size)

    def free(self, indices):
        """Returns the pages of `indices` (whole pages this pool allocated);
        ValueError, with nothing freed, for any other index or a repeat."""
        torch = _torch()
        with self.lock:
            pages = idx.pages_of(indices, self.page_size, self.size, "free")
            if pages.numel() == 0:
                return 0
            if torch.unique(pages).numel() != pages.numel():
                raise errors.InvalidArgument("free: a page appears twice")
            if not bool(self._held[pages].all()):
                raise errors.InvalidArgument(
                    "free: indices that this host pool did not allocate (or freed already)")
            self.client.free(self.pool_name, idx.runs_of(pages))
            self._held[pages] = False
            self._free_slots += pages.numel() * self.page_size
            return pages.numel() * self.page_size

    # -- transfers -----------------------------------------------------------

    def _mechanism(self, io_backend):
        if io_backend not in _IO_BACKENDS[self.layout]:
            raise ValueError(f"Unsupported IO backend: {io_backend}")
        return _MECHANISMS[io_backend]

    def _runs(self, device_pool, host_indices, device_indices):
        if device_pool is not self.device_pool:
            raise errors.InvalidArgument(
                "a device pool other than the one this host pool registered")
        host_runs = idx.page_runs(host_indices, self.page_size, self.size)
        device_runs = idx.slot_runs(device_indices, self._device_slots)
        host_tokens = sum(n for _, n in host_runs) * self.page_size
        device_tokens = sum(n for _, n in device_runs)
        if host_tokens != device_tokens:
            raise errors.InvalidArgument(
                f"{host_tokens} host indices but {device_tokens} device indices")
        return host_runs, device_runs

    def load_to_device_per_layer(self, device_pool, host_indices, device_indices,
                                 layer_id, io_backend):
        """Layer `layer_id` of host_indices -> device_indices: the first
        call of a load submits every layer from layer_id on, each call waits
        for its own layer."""
        mechanism = self._mechanism(io_backend)
        if not 0 <= layer_id < self.layer_num:
            raise errors.InvalidArgument(
                f"layer_id {layer_id} outside [0, {self.layer_num})")
        key = (id(host_indices), id(device_indices))
        pending = getattr(self._loads, "pending", None)
        if pending is None or pending[0] != key or layer_id < pending[2]:
            host_runs, device_runs = self._runs(device_pool, host_indices, device_indices)
            if not host_runs:
                return
            # The device slots may still be in use by work queued on the
            # current stream: the daemon's copy waits for this mark (CUDA).
            op = self.client.load(self.pool_name, self.import_id, host_runs, device_runs,
                                  layer_begin=layer_id, layer_end=self.layer_num,
                                  mechanism=mechanism,
                                  wait_kv_written=self._sync.mark_kv_written())
            pending = [key, op, layer_id]
            self._loads.pending = pending
        self._sync.wait_layer(pending[1], layer_id)
        pending[2] = layer_id + 1
        if pending[2] >= self.layer_num:
            self._loads.pending = None

    def backup_from_device_all_layer(self, device_pool, host_indices, device_indices,
                                     io_backend):
        """Every layer of device_indices -> host_indices; done when the call
        returns (CPU) or when the current stream reaches this point (CUDA)."""
        mechanism = self._mechanism(io_backend)
        host_runs, device_runs = self._runs(device_pool, host_indices, device_indices)
        if not host_runs:
            return
        op = self.client.backup(self.pool_name, self.import_id, host_runs, device_runs,
                                mechanism=mechanism,
                                wait_kv_written=self._sync.mark_kv_written())
        self._sync.wait_all(op)

    # -- pages for storage backends --------------------------------------------

    def _page_index(self, index):
        index = int(index)
        if index % self.page_size != 0 or not 0 <= index < self.size:
            raise errors.InvalidArgument(
                f"page index {index}: the first slot of a page in [0, {self.size})")
        return index

    def get_data_page(self, index, flat=True):
        """The page starting at slot `index` in the layout's own axis order."""
        index = self._page_index(index)
        if self.kv_buffer is not None:
            page = self._page_view(self.kv_buffer, index)
        else:
            data = self.client.read_pages(self.pool_name, [(index // self.page_size, 1)])
            page = _torch().frombuffer(bytearray(data), dtype=_torch().uint8).view(
                self.dtype).view(self._page_shape())
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        torch = _torch()
        pin = self.pin_memory and torch.cuda.is_available()
        return torch.zeros(self._page_shape(), dtype=self.dtype, device="cpu",
                           pin_memory=pin).flatten()

    def set_from_flat_data_page(self, index, data_page):
        """Writes a flat page (get_data_page's format) at slot `index`, a page
        this host pool holds."""
        torch = _torch()
        index = self._page_index(index)
        shape = self._page_shape()
        numel = 1
        for d in shape:
            numel *= d
        if data_page.numel() != numel:
            raise errors.InvalidArgument(
                f"a flat page has {numel} elements, not {data_page.numel()}")
        if not bool(self._held[index // self.page_size]):
            raise errors.InvalidArgument(
                f"page at slot {index} is not allocated by this host pool")
        data = data_page.to(device="cpu", dtype=self.dtype)
        if self._mapping is not None and self._mapping.writable:
            self._page_view(self.kv_buffer, index).copy_(data.reshape(shape))
        else:
            raw = data.contiguous().view(torch.uint8).numpy().tobytes()
            self.client.write_pages(self.pool_name, [(index // self.page_size, 1)], raw)

    def get_page_buffer_meta(self, indices):
        """(pointers, sizes): the pieces of each page of `indices` (every
        page_size-th index starts a page) in this process's mapping."""
        indices = idx.as_index_tensor(indices, "get_page_buffer_meta")
        assert len(indices) % self.page_size == 0
        if self._mapping is None:
            raise errors.FailedPrecondition(
                "zero-copy page buffers need the pool mapped: use a unix: target")
        starts = [self._page_index(i) // self.page_size
                  for i in indices[::self.page_size].tolist()]
        meta = self.client.get_page_buffer_meta(self.pool_name, [(p, 1) for p in starts])
        base = self._mapping.address
        return ([base + piece.offset for piece in meta.pieces],
                [piece.size for piece in meta.pieces])

    # -- per attention ---------------------------------------------------------

    _planes = 1

    def _pool_spec(self, name, dtype, requested):
        raise NotImplementedError

    def _device_layers(self, device_pool):
        raise NotImplementedError

    def _page_shape(self):
        raise NotImplementedError

    def _page_view(self, buf, index):
        return page_copy.page_view(buf, self.layout, self.kind == "mha", index,
                                   self.page_size)


class RemoteMHATokenToKVPoolHost(RemoteHostKVCache):
    """SGLang's MHATokenToKVPoolHost on hostkvd."""

    kind = "mha"
    layouts = ("layer_first", "page_first", "page_first_direct", "page_head")
    _planes = 2

    def get_size_per_token(self):
        self.head_num = self.device_pool.head_num
        self.head_dim = self.device_pool.head_dim
        self.layer_num = self.device_pool.layer_num
        return self.head_dim * self.head_num * self.layer_num * _itemsize(self.dtype) * 2

    def get_ksize_per_token(self):
        return self.get_size_per_token() // 2

    @property
    def k_buffer(self):
        return None if self.kv_buffer is None else self.kv_buffer[0]

    @property
    def v_buffer(self):
        return None if self.kv_buffer is None else self.kv_buffer[1]

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

    def get_size_per_token(self):
        self.kv_lora_rank = self.device_pool.kv_lora_rank
        self.qk_rope_head_dim = self.device_pool.qk_rope_head_dim
        self.layer_num = self.device_pool.layer_num
        return ((self.kv_lora_rank + self.qk_rope_head_dim) * 1 * _itemsize(self.dtype)
                * self.layer_num)

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def _pool_spec(self, name, dtype, requested):
        return mla_pool_spec(name, self.layer_num, self.kv_lora_rank,
                             self.qk_rope_head_dim, self.page_size, dtype=dtype,
                             layout=self.layout, capacity_tokens=requested)

    def _device_layers(self, device_pool):
        return list(device_pool.kv_buffer), []

    def _page_shape(self):
        L, ps = self.layer_num, self.page_size
        kv_dim = self.kv_lora_rank + self.qk_rope_head_dim
        return {"layer_first": (L, ps, 1, kv_dim), "page_first": (ps, L, 1, kv_dim),
                "page_first_direct": (1, L, ps, 1, kv_dim)}[self.layout]
