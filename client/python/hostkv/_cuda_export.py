"""export_cuda: CUDA tensors as DeviceBuffers (the twin of ExportCudaBuffer
in hostkv/cuda_buffers.h), through PyTorch's own CUDA IPC export
(`_share_cuda_`). See hostkv.cuda for the whole picture.
"""
import importlib
import threading
import uuid as _uuid

from . import errors
from ._proto import hostkv_pb2 as pb

CUDA_IPC_HANDLE_BYTES = 64

_EXPANDABLE = (
    "this tensor's memory comes from PyTorch's expandable segments "
    "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), which cannot be exported "
    "with cudaIpcGetMemHandle: unset it (or use expandable_segments:False) before "
    "the KV cache is allocated")

_lock = threading.Lock()
_exports = {}  # (device, storage data_ptr) -> (handle, storage offset, nbytes)
_uuids = {}  # device index -> 16 raw bytes (or b"")


def _torch():
    try:
        return importlib.import_module("torch")
    except ImportError as e:
        raise errors.FailedPrecondition(f"hostkv.cuda needs torch: {e}") from None


def ipc_handle_of(shared):
    """The 64-byte cudaIpcMemHandle_t in `shared`, the handle _share_cuda_
    returned: the handle itself (older PyTorch) or a versioned one
    (version byte, kind byte 'c', then the handle). InvalidArgument for
    expandable-segment memory (kind 'e') or a handle of unknown form."""
    shared = bytes(shared or b"")
    if len(shared) == CUDA_IPC_HANDLE_BYTES:
        return shared
    kind = shared[1:2]
    if kind == b"e":
        raise errors.InvalidArgument(_EXPANDABLE)
    if kind == b"c" and len(shared) == 2 + CUDA_IPC_HANDLE_BYTES:
        return shared[2:]
    raise errors.InvalidArgument(
        f"PyTorch shared this memory as a {len(shared)}-byte handle of kind {kind!r}, "
        "not a cudaIpcMemHandle (kind b'c', 66 bytes, or 64 bytes)")


def _storage_of(tensor):
    if hasattr(tensor, "untyped_storage"):
        return tensor.untyped_storage()
    return tensor.storage()  # torch < 2.0


def _share(tensor):
    """(handle, byte offset of the storage in its allocation) of tensor's storage."""
    storage = _storage_of(tensor)
    key = (tensor.device.index, storage.data_ptr())
    with _lock:
        known = _exports.get(key)
        if known is not None and known[2] == storage.nbytes():
            return known[0], known[1]
        try:
            shared = storage._share_cuda_()  # pylint: disable=protected-access
        except RuntimeError as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if "expandable" in reason.lower():
                raise errors.InvalidArgument(f"{_EXPANDABLE} (PyTorch: {reason})") from None
            raise errors.InvalidArgument(
                f"PyTorch cannot export this tensor's memory: {reason} (memory from "
                "expandable segments, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, "
                "or the cudaMallocAsync backend cannot be exported)") from None
        handle = ipc_handle_of(shared[1])
        _exports[key] = (handle, int(shared[3]), storage.nbytes())
        return handle, int(shared[3])


def device_uuid(index):
    """The 16 raw bytes of device `index`'s UUID (cudaDeviceProp.uuid, what
    DeviceBuffer.device_uuid holds), or b"" when torch does not report it."""
    with _lock:
        if index in _uuids:
            return _uuids[index]
    value = getattr(_torch().cuda.get_device_properties(index), "uuid", None)
    raw = b""
    if value is not None and getattr(value, "bytes", None) is not None:
        raw = bytes(value.bytes)  # a list of 16 ints
    elif value is not None:
        text = str(value)
        try:
            raw = _uuid.UUID(text[4:] if text.startswith("GPU-") else text).bytes
        except ValueError:
            raw = b""
    raw = raw if len(raw) == 16 else b""
    with _lock:
        _uuids[index] = raw
    return raw


def export_cuda(tensor):
    """The registration entry (hostkv_pb2.DeviceBuffer) of CUDA tensor
    `tensor`: the cudaIpcMemHandle of the allocation holding it, its byte
    offset there, its size in bytes, its device ordinal and UUID.

    InvalidArgument for anything but a non-empty contiguous CUDA tensor, and
    for memory that cannot be exported (expandable segments).
    """
    if not getattr(tensor, "is_cuda", False):
        where = getattr(getattr(tensor, "device", None), "type", type(tensor).__name__)
        raise errors.InvalidArgument(f"export_cuda needs a CUDA tensor, not a {where} one")
    if not tensor.is_contiguous():
        raise errors.InvalidArgument(
            "a device buffer must be contiguous (rows of token_slots); this tensor "
            "is a strided view: export the contiguous per-layer tensor")
    size = tensor.numel() * tensor.element_size()
    if size == 0:
        raise errors.InvalidArgument("an empty tensor has no memory to export")
    handle, storage_offset = _share(tensor)
    index = tensor.device.index
    return pb.DeviceBuffer(
        cuda_ipc_handle=handle,
        offset=storage_offset + tensor.storage_offset() * tensor.element_size(),
        size=size, device=index, device_uuid=device_uuid(index))


def device_buffers_for_cuda(k_layers, v_layers=()):
    """The (k, v) entry lists of per-layer CUDA tensors of token_slots rows
    (MHA K and V; MLA the latent in k_layers), for
    client.register_device_buffers(pool, token_slots, k, v)."""
    return [export_cuda(t) for t in k_layers], [export_cuda(t) for t in v_layers]

