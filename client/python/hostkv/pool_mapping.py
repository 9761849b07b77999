"""A pool's host pages mapped into this process (Client.map_pool).

    mapping = client.map_pool("llama")
    kv = mapping.kv_buffer()      # torch view in SGLang's shape for the layout
    mapping.address               # where the segment starts in this process

The mapping stays as long as the PoolMapping or any tensor made from it is
alive (tensors keep it), so a view never outlives its memory. The bytes are
the daemon's: a load or a backup in flight changes them under a reader, as
SGLang's own host pool does.
"""
import ctypes
import mmap
import os

from . import errors
from ._proto import hostkv_pb2 as pb

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value

_TORCH_DTYPES = {pb.DTYPE_BF16: "bfloat16", pb.DTYPE_FP16: "float16",
                 pb.DTYPE_FP32: "float32", pb.DTYPE_FP8_E4M3: "float8_e4m3fn",
                 pb.DTYPE_FP8_E5M2: "float8_e5m2"}


def torch_dtype(dtype):
    """The torch dtype of a hostkv_pb2.Dtype (InvalidArgument if this torch
    has none, e.g. fp8 before torch 2.1)."""
    import torch  # pylint: disable=import-outside-toplevel
    name = _TORCH_DTYPES.get(dtype)
    if name is None or not hasattr(torch, name):
        raise errors.InvalidArgument(
            f"dtype {pb.Dtype.Name(dtype)} has no torch dtype in torch {torch.__version__}")
    return getattr(torch, name)


def sglang_shape(pool):
    """The shape SGLang gives its host kv_buffer for `pool` (a hostkv_pb2.Pool):
    MHA (2, ...) K then V, MLA without the K/V axis (docs: REFERENCE.md)."""
    spec = pool.spec
    size, ps = pool.token_slots, spec.page_size
    pages = size // ps
    layout = spec.layout
    if spec.geometry.WhichOneof("attention") == "mha":
        g = spec.geometry.mha
        layers, heads, dim = g.num_layers, g.num_kv_heads, g.head_dim
        shapes = {
            pb.LAYOUT_LAYER_FIRST: (2, layers, size, heads, dim),
            pb.LAYOUT_PAGE_FIRST: (2, size, layers, heads, dim),
            pb.LAYOUT_PAGE_FIRST_DIRECT: (2, pages, layers, ps, heads, dim),
            pb.LAYOUT_PAGE_HEAD: (2, pages, heads, ps, layers, dim),
        }
    else:
        g = spec.geometry.mla
        layers = g.num_layers
        kv_dim = getattr(g, "kv_cache_dim", 0) or g.kv_lora_rank + g.qk_rope_head_dim
        shapes = {
            pb.LAYOUT_LAYER_FIRST: (layers, size, 1, kv_dim),
            pb.LAYOUT_PAGE_FIRST: (size, layers, 1, kv_dim),
            pb.LAYOUT_PAGE_FIRST_DIRECT: (pages, layers, ps, 1, kv_dim),
        }
    if layout not in shapes:
        raise errors.InvalidArgument(f"no SGLang shape for layout {pb.Layout.Name(layout)}")
    return shapes[layout]


class PoolMapping:
    """`fd` (a pool segment's descriptor; not taken over) mapped whole,
    read-write when `writable`. `pool` is its hostkv_pb2.Pool."""

    def __init__(self, fd, pool, writable):
        size = os.fstat(fd).st_size
        if size < pool.total_bytes:
            raise errors.Internal(
                f"pool segment of {size} bytes, the pool needs {pool.total_bytes}")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        address = _libc.mmap(None, size, prot, mmap.MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise errors.Internal(f"mapping the pool segment: {os.strerror(err)}")
        self.address = address
        self.size = size
        self.writable = writable
        self.pool = pool
        # Tensors made from the mapping hold this array, which holds self:
        # the mapping goes (munmap) only when neither is reachable.
        self._array = (ctypes.c_uint8 * size).from_address(address)
        self._array.hostkv_mapping = self

    def bytes_view(self):
        """A memoryview of the whole segment (writes fault if read-only)."""
        return memoryview(self._array).cast("B")

    def tensor(self):
        """The segment as a flat uint8 CPU tensor sharing the mapping."""
        import torch  # pylint: disable=import-outside-toplevel
        import warnings  # pylint: disable=import-outside-toplevel
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a read-only mapping is non-writable
            return torch.frombuffer(self._array, dtype=torch.uint8)

    def kv_buffer(self, dtype=None):
        """The pool's pages as SGLang's kv_buffer: a tensor in
        sglang_shape(pool), sharing the mapping, of the pool's dtype or of
        `dtype` (one of the same item size: SGLang keeps fp8 KV as uint8)."""
        shape = sglang_shape(self.pool)
        dtype = dtype or torch_dtype(self.pool.spec.geometry.dtype)
        flat = self.tensor()[:self.pool.total_bytes]
        return flat.view(dtype).view(shape)

    def __del__(self):
        # Reached only once no tensor holds the array (and so this object).
        address = getattr(self, "address", None)
        if address:
            _libc.munmap(address, self.size)
            self.address = 0
