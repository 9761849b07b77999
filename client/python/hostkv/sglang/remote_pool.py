"""RemoteHostKVCache: what the MHA and MLA host pools served by hostkvd
share (host_pool.py has the two classes SGLang's code names).

The constructor is SGLang's HostKVCache's (pool_host/base.py at
39baee9e; the keyword-only dcp/pool_label of newer trees accepted):
device_pool, host_to_device_ratio, host_size, page_size, layout,
pin_memory, device, allocator_type, then per class one positional extra
(MHA host_page_num, MLA override_kv_cache_dim). Sizing, the too-small
warning, alloc/free/available_size and their errors are SGLang's; the
pages live in a hostkvd pool instead of this process. Transfers accept
every keyword SGLang's controller and L2 transfer engines pass
(is_draft=, and unknown ones, logged once), and the newer engine's
prepare_transfer_indices / *_physical calls.

Keywords beyond SGLang's: target= (default $HOSTKV_TARGET, else
unix:/run/hostkv/hostkvd.sock), pool_name= (default: $HOSTKV_POOL, else a
private pool of this object, deleted with its session; a named pool is
attached and outlives the engine), client_name=, auth_token= (default:
the file $HOSTKV_TOKEN_FILE), async_submit= (default: True on CUDA, else
$HOSTKV_ASYNC_SUBMIT=1; see transfer_submitter.py).
"""
import itertools
import logging
import os
import threading

from .. import client as client_module
from .. import errors
from .._pace import Pace
from .. import torch as hostkv_torch
from . import indices as idx
from . import page_copy
from .host_slots import HostSlots
from .transfer_submitter import Pending, TransferSubmitter
from .transfer_sync import sync_for

_log = logging.getLogger("hostkv.sglang")

# Which io_backend each layout supports in SGLang (REFERENCE.md).
_IO_BACKENDS = {"layer_first": ("kernel", "direct"), "page_first": ("kernel",),
                "page_first_direct": ("direct",), "page_head": ("kernel",)}
_MECHANISMS = {"kernel": 1, "direct": 2}  # hostkv_pb2.MECHANISM_KERNEL / _DIRECT
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
                "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
                "uint8": "fp8_e4m3"}  # SGLang stores fp8 KV as uint8: bytes alike
# Keywords of SGLang's constructors (any version) that need nothing here.
_ACCEPTED = {"host_memory_mode", "registration_granularity_bytes"}
_private_pools = itertools.count()
_PROBE_INTERVAL = 0.5  # seconds between asks while hostkvd is away
_warned = set()


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


def _warn_once(key, message, *args):
    if key not in _warned:
        _warned.add(key)
        _log.warning(message, *args)


class RemoteHostKVCache:
    """What MHA and MLA share: sizing, the pool, allocation, transfers.
    Thread-safe (SGLang's scheduler and storage threads call it at once)."""

    kind = None           # "mha" / "mla"
    layouts = ()          # the layouts this attention supports
    positional_extras = ()  # the class's own positional parameters after allocator_type
    dcp_size, dcp_rank = 1, 0
    can_use_write_back_jit = False  # SGLang's staged write-back kernel: not used
    # Read by newer controllers into the storage model name: None, as on
    # SGLang's own host pools (the pages are SGLang's layouts byte for byte).
    storage_format_tag = None

    def __init__(self, device_pool, host_to_device_ratio, host_size, page_size,
                 layout="layer_first", pin_memory=True, device="cpu",
                 allocator_type="default", *extras, target=None, pool_name=None,
                 client_name=None, auth_token=None, async_submit=None, **kwargs):
        options = self._options(extras, kwargs)
        self.device_pool = device_pool
        self.page_size = page_size
        self.layout = layout
        self.pin_memory = pin_memory
        self.device = device
        self.allocator_type = allocator_type  # the memory is hostkvd's
        self.pool_label = options.pop("pool_label", "kv")
        self.dtype = device_pool.store_dtype
        self._configure(options)
        self.size_per_token = self.get_size_per_token()
        self._size(device_pool, host_to_device_ratio, host_size,
                   options.get("host_page_num"))
        self.start_layer = getattr(device_pool, "start_layer", 0)
        self.end_layer = getattr(device_pool, "end_layer", self.layer_num - 1)
        if layout not in self.layouts:
            raise ValueError(f"Unsupported layout: {layout}")
        self.token_stride_size = self.size_per_token // self.layer_num // self._planes
        self.layout_dim = self.token_stride_size * self.layer_num
        self.lock = threading.RLock()
        # Per thread, the all-layer load in progress: [key, Pending, next layer].
        self._loads = threading.local()
        self._failure = None  # an asynchronous submission's error, raised next call
        self._destroyed = False
        self._probes = Pace(_PROBE_INTERVAL)  # while hostkvd is away: asked this often

        pool_name = pool_name or os.environ.get("HOSTKV_POOL") or None
        private = pool_name is None
        self.pool_name = pool_name or f"sglang-{self.kind}-{os.getpid()}-{next(_private_pools)}"
        self.client = client_module.Client(
            target or os.environ.get("HOSTKV_TARGET") or client_module.DEFAULT_TARGET,
            client_name or f"sglang-{self.kind}-{os.getpid()}",
            auth_token=auth_token if auth_token is not None else _default_token())
        try:
            self._open_pool(private, async_submit)
        except BaseException:
            self.client.close()
            raise
        if self.client.has_session_socket:
            self.client.on_daemon_lost(self._on_daemon_lost)
        self.clear()

    # -- construction ------------------------------------------------------

    def _options(self, extras, kwargs):
        """The keyword view of SGLang's extra arguments; TypeError for too
        many positionals, NotImplementedError for what hostkv cannot serve."""
        if len(extras) > len(self.positional_extras):
            raise TypeError(
                f"{type(self).__name__}() takes at most "
                f"{8 + len(self.positional_extras)} positional arguments")
        options = dict(zip(self.positional_extras, extras))
        for name in self.positional_extras:
            if name in kwargs:
                if name in options:
                    raise TypeError(f"got multiple values for argument {name!r}")
                options[name] = kwargs.pop(name)
        if "host_page_num" in kwargs:  # SGLang's base takes it for every class
            options["host_page_num"] = kwargs.pop("host_page_num")
        mode = kwargs.pop("host_memory_mode", "cache")
        if mode != "cache":
            raise NotImplementedError(
                f"host_memory_mode={mode!r}: hostkv serves the 'cache' mode only")
        dcp = (kwargs.pop("dcp_size", 1) or 1, kwargs.pop("dcp_rank", 0) or 0)
        if dcp != (1, 0):
            raise NotImplementedError(
                f"dcp_size={dcp[0]}, dcp_rank={dcp[1]}: hostkv serves host pools "
                "without decode context parallelism only")
        if kwargs.pop("mtp_draft_device_pools", ()):
            raise NotImplementedError(
                "mtp_draft_device_pools: hostkv does not pack draft (MTP) layers into "
                "the target's host pool")
        if "pool_label" in kwargs:
            options["pool_label"] = kwargs.pop("pool_label")
        unknown = sorted(set(kwargs) - _ACCEPTED)
        if unknown:
            _warn_once(("ctor", tuple(unknown)),
                       "hostkv: %s(%s) ignores keywords it does not know",
                       type(self).__name__, ", ".join(unknown))
        return options

    def _configure(self, options):
        """Per attention: takes the class's own options (before sizing)."""
        del options

    def _size(self, device_pool, ratio, host_size, host_page_num):
        """SGLang's sizing: host_page_num pages exactly, else tokens from
        host_size GB or ratio x the device pool, plus one page."""
        if host_page_num is not None:
            if host_page_num <= 0:
                raise ValueError(
                    f"HiCache host page count must be positive, got {host_page_num}.")
            self.page_num = int(host_page_num)
        else:
            if host_size > 0:
                tokens = int(host_size * 1e9 // self.size_per_token)
            else:
                tokens = int(device_pool.size * ratio)
            self.page_num = tokens // self.page_size + 1
        self.size = self.page_num * self.page_size
        if self.size <= device_pool.size:
            _log.warning(
                "HiCache host KV pool (%d tokens) is smaller than the device pool "
                "(%d tokens); L2 cache effectiveness is reduced. Consider increasing "
                "--hicache-ratio (or --hicache-size) for higher L2 cache hit rate.",
                self.size, device_pool.size)

    def _open_pool(self, private, async_submit):
        dtype = _DTYPE_NAMES.get(str(self.dtype).replace("torch.", ""))
        if dtype is None:
            raise ValueError(f"hostkv has no pool dtype for {self.dtype}")
        # capacity_tokens so that hostkvd's sizing (tokens // page_size + 1
        # pages) gives SGLang's page_num.
        spec = self._pool_spec(self.pool_name, dtype, (self.page_num - 1) * self.page_size)
        try:
            pool = self.client.create_pool(spec, attach_if_exists=True,
                                           delete_with_session=private)
        except errors.ResourceExhausted as e:
            if "--max_pool" in e.message:  # a per-user limit, not memory
                raise errors.ResourceExhausted(
                    f"hostkvd refused host pool {self.pool_name}: {e.message}; delete "
                    "pools this user no longer needs, name one to share "
                    "(HOSTKV_POOL), or raise the daemon's flag") from None
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
        self._slots = HostSlots(self.page_num, self.page_size)
        k, v = self._device_layers(self.device_pool)
        self._device_slots = int(k[0].shape[0])
        entries_k = [hostkv_torch.describe(self.client, t) for t in k]
        entries_v = [hostkv_torch.describe(self.client, t) for t in v]
        self._sync = sync_for(self.client, k[0], self.layer_num)
        if async_submit is None:
            async_submit = (self._sync.asynchronous
                            or os.environ.get("HOSTKV_ASYNC_SUBMIT") == "1")
        self._submitter = TransferSubmitter(bool(async_submit), "hostkv-submit")
        self.import_id = self.client.register_device_buffers(
            self.pool_name, self._device_slots, entries_k, entries_v,
            gpu_signals=self._sync.gpu_signals())
        self._sync.attach(self.import_id)

    def close(self):
        """Ends the session: the daemon frees this pool's pages and imports
        (and deletes a private pool). The engine's process exit does the same."""
        self._submitter.close()
        self.client.close()

    def destroy(self):
        """SGLang's destroy(): releases the host memory (here: the session). Idempotent."""
        if not self._destroyed:
            self._destroyed = True
            self.close()
            self.kv_buffer = None

    # -- allocation (SGLang's HostKVCache) -----------------------------------

    def clear(self):
        """Frees every page this host pool holds."""
        with self.lock:
            held = self._slots.held_page_numbers()
            if held.numel() > 0:
                self.client.free(self.pool_name, idx.runs_of(held))
            self._slots.reset()

    def _on_daemon_lost(self):
        _log.warning("hostkv: hostkvd went away; host pool %s allocates nothing "
                     "(available_size 0) until it answers again", self.pool_name)

    def _daemon_answers(self):
        """False while hostkvd is away (asked again at most every 0.5 s), so
        that SGLang skips backups instead of failing; SessionLost, naming the
        cause, once it answers without this pool's session."""
        if not self.client.daemon_away:
            return True
        if not self._probes.due():
            return False
        return self.client.probe()

    def available_size(self):
        """Token slots alloc can still hand out (whole pages); 0 while
        hostkvd is away."""
        if not self._daemon_answers():
            return 0
        return self._slots.free_pages() * self.page_size

    @property
    def logical_size(self):
        return self.size * self.dcp_size

    @property
    def logical_page_size(self):
        return self.page_size * self.dcp_size

    def alloc(self, need_size):
        """need_size token slots (a multiple of page_size) as an int64
        tensor of token indices, or None if fewer are free or hostkvd is
        away (it never waits for the daemon)."""
        assert need_size % self.page_size == 0, (
            "The requested size should be a multiple of the page size.")
        with self.lock:
            if need_size > self.available_size():
                return None  # also while hostkvd is away: SGLang skips the backup
            if need_size == 0:
                return _torch().empty(0, dtype=_torch().int64)
            try:
                runs = self.client.alloc(self.pool_name, need_size, wait=False)
            except errors.ResourceExhausted:
                return None  # a shared pool: other sessions took the rest
            except errors.Unavailable:
                return None  # hostkvd went away: as above
            self._slots.take(runs)
            return idx.token_indices(runs, self.page_size)

    def free(self, indices):
        """Frees token slots `indices` (SGLang: any slots currently
        allocated, token by token); a page goes back to hostkvd once all of
        its slots are free. AssertionError for a slot not allocated (freed
        already, or never), IndexError for one outside the pool: nothing is
        freed then. Returns len(indices)."""
        indices = idx.as_index_tensor(indices, "free")
        with self.lock:
            pages = self._slots.pages_freed_by(indices)
            if pages.numel():
                self.client.free(self.pool_name, idx.runs_of(pages))
            self._slots.release(indices, pages)
            return indices.numel()

    # -- transfers -----------------------------------------------------------

    def _mechanism(self, io_backend):
        if io_backend not in _IO_BACKENDS[self.layout]:
            raise ValueError(f"Unsupported IO backend: {io_backend}")
        return _MECHANISMS[io_backend]

    def _check_call(self, device_pool, kwargs):
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        if kwargs.pop("is_draft", False):
            raise NotImplementedError(
                "is_draft=True: hostkv does not serve a draft model's KV through the "
                "target's host pool")
        if kwargs:
            _warn_once(("call", tuple(sorted(kwargs))),
                       "hostkv: transfers ignore keywords they do not know: %s",
                       ", ".join(sorted(kwargs)))
        if device_pool is not self.device_pool:
            raise errors.InvalidArgument(
                "a device pool other than the one this host pool registered")

    def _runs(self, host_indices, device_indices):
        """(host page runs, device slot runs); on the submitter's thread."""
        return idx.transfer_runs(host_indices.get(), device_indices.get(), self.page_size,
                                 self.size, self._device_slots)

    def _submit(self, method, host_indices, device_indices, mechanism, layer_begin):
        """Hands one transfer to the submitter; returns its Pending."""
        sync = self._sync
        num_layers = self.layer_num - layer_begin
        host = sync.host_indices(host_indices)
        device = sync.host_indices(device_indices)
        # The device slots may still be in use by work queued on the
        # current stream: the daemon's copy waits for this mark (CUDA).
        mark = sync.mark_kv_written()
        value = sync.signal_value()

        pending = Pending(layer_begin, num_layers, value)

        def call():
            try:
                host_runs, device_runs = self._runs(host, device)
                gpu = {"signal_value": value, "gpu_waits_only": True} if value else {}
                return method(self.pool_name, self.import_id, host_runs, device_runs,
                              layer_begin=layer_begin, layer_end=self.layer_num,
                              mechanism=mechanism, wait_kv_written=mark, **gpu)
            except BaseException as e:
                if self._submitter.asynchronous and sync.failed(pending):
                    self._failure = e  # nobody waits on the host: the next call raises it
                raise

        pending.future = self._submitter.submit(call)
        return pending

    def prepare_transfer_indices(self, host_indices, device_indices, io_backend):
        """SGLang's L2 transfer engine asks once per transfer; hostkv's
        indices need no translation."""
        del io_backend
        return host_indices, device_indices

    def load_to_device_per_layer(self, device_pool, host_indices, device_indices,
                                 layer_id, io_backend, **kwargs):
        """Layer `layer_id` of host_indices -> device_indices: the first
        call of a load submits every layer from layer_id on, each call waits
        for its own layer (CPU: here; CUDA: on the current stream)."""
        mechanism = self._mechanism(io_backend)
        self._check_call(device_pool, kwargs)
        if not 0 <= layer_id < self.layer_num:
            raise errors.InvalidArgument(
                f"layer_id {layer_id} outside [0, {self.layer_num})")
        key = (id(host_indices), id(device_indices))
        pending = getattr(self._loads, "pending", None)
        if pending is None or pending[0] != key or layer_id < pending[2]:
            if len(host_indices) == 0:
                return
            submitted = self._submit(self.client.load, host_indices, device_indices,
                                     mechanism, layer_id)
            pending = [key, submitted, layer_id]
            self._loads.pending = pending
        self._sync.wait_layer(pending[1], layer_id)
        pending[2] = layer_id + 1
        if pending[2] >= self.layer_num:
            self._loads.pending = None

    def backup_from_device_all_layer(self, device_pool, host_indices, device_indices,
                                     io_backend, **kwargs):
        """Every layer of device_indices -> host_indices; done when the call
        returns (CPU) or when the current stream reaches this point (CUDA)."""
        mechanism = self._mechanism(io_backend)
        self._check_call(device_pool, kwargs)
        if len(host_indices) == 0 and len(device_indices) == 0:
            return
        pending = self._submit(self.client.backup, host_indices, device_indices,
                               mechanism, 0)
        self._sync.wait_all(pending)

    def load_to_device_per_layer_physical(self, device_pool, host_indices, device_indices,
                                          layer_id, io_backend, **kwargs):
        self.load_to_device_per_layer(device_pool, host_indices, device_indices,
                                      layer_id, io_backend, **kwargs)

    def backup_from_device_all_layer_physical(self, device_pool, host_indices,
                                              device_indices, io_backend, **kwargs):
        self.backup_from_device_all_layer(device_pool, host_indices, device_indices,
                                          io_backend, **kwargs)

    def drain_submissions(self):
        """Waits until every transfer submitted so far reached hostkvd."""
        self._submitter.drain()

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
        with self.lock:
            held = bool(self._slots.held[index // self.page_size])
        if not held:
            raise errors.InvalidArgument(
                f"page at slot {index} is not allocated by this host pool")
        data = data_page.to(device="cpu", dtype=self.dtype)
        if self._mapping is not None and self._mapping.writable:
            self._page_view(self.kv_buffer, index).copy_(data.reshape(shape))
        else:
            raw = data.contiguous().view(torch.uint8).numpy().tobytes()
            self.client.write_pages(self.pool_name, [(index // self.page_size, 1)], raw)

    def _mapped_address(self, what):
        if self._mapping is None:
            raise errors.FailedPrecondition(
                f"{what} needs the pool mapped: use a unix: target")
        return self._mapping.address

    def _page_starts(self, indices, what):
        indices = idx.as_index_tensor(indices, what)
        assert len(indices) % self.page_size == 0
        return [self._page_index(i) for i in indices[::self.page_size].tolist()]

    def get_page_buffer_meta(self, indices):
        """(pointers, sizes): the pieces of each page of `indices` (every
        page_size-th index starts a page) in this process's mapping."""
        base = self._mapped_address("zero-copy page buffers")
        starts = self._page_starts(indices, "get_page_buffer_meta")
        meta = self.client.get_page_buffer_meta(
            self.pool_name, [(p // self.page_size, 1) for p in starts])
        return ([base + piece.offset for piece in meta.pieces],
                [piece.size for piece in meta.pieces])

    def is_stride_page_aligned(self, page_size_bytes=4096):
        """Whether every page starts on a `page_size_bytes` boundary of the
        mapping (SGLang's rule: layouts with pages contiguous per plane)."""
        if self.layout == "layer_first" or self._mapping is None:
            return False
        stride = self.page_size * self.layout_dim
        return self._mapping.address % page_size_bytes == 0 and stride % page_size_bytes == 0

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
