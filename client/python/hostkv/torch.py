"""torch helpers: CPU tensors in sealed shared memory, and their registration.

    kv = hostkv.torch.shm_tensor((2, layers, slots, heads, dim), torch.bfloat16)
    k, v = hostkv.torch.device_buffers_for(client, list(kv[0]), list(kv[1]))
    import_id = client.register_device_buffers(pool, slots, k, v)

device_buffers_for takes CUDA tensors too (for hostkvd --cuda; see
hostkv.cuda, which also has the GPU completion words).

torch is imported when first needed, so `import hostkv` works without it.
"""
import importlib
import weakref

from . import _cuda_export, errors, shm

# Live SealedBuffers behind shm_tensor()s, to find the one a view lies in.
_buffers = weakref.WeakSet()


def _torch():
    return importlib.import_module("torch")


def shm_tensor(shape, dtype):
    """A zeroed CPU tensor of `shape` and `dtype` backed by a SealedBuffer.

    The buffer stays alive with the tensor (tensor.hostkv_buffer); views of
    it (t[0, l] per layer) can be registered with device_buffers_for.
    """
    torch = _torch()
    shape = tuple(int(d) for d in shape)
    numel = 1
    for d in shape:
        numel *= d
    itemsize = torch.empty((), dtype=dtype).element_size()
    buffer = shm.SealedBuffer(max(1, numel * itemsize))
    flat = torch.frombuffer(buffer.mmap, dtype=torch.uint8)  # shares the mapping
    tensor = flat[:numel * itemsize].view(dtype).view(shape)
    tensor.hostkv_buffer = buffer
    _buffers.add(buffer)
    return tensor


def _buffer_of(tensor):
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    for buffer in list(_buffers):
        if buffer.fd >= 0 and buffer.address <= start and end <= buffer.address + buffer.size:
            return buffer
    raise errors.InvalidArgument(
        "the tensor does not lie in a hostkv.torch.shm_tensor buffer")


def describe(client, tensor):
    """The registration entry of `tensor`, contiguous: a CPU tensor inside a
    shm_tensor (its buffer is passed to the daemon once per session), or a
    CUDA tensor (hostkv.cuda.export_cuda; `client` is not used)."""
    if device_of(tensor) == "cuda":
        return _cuda_export.export_cuda(tensor)
    if device_of(tensor) != "cpu":
        raise errors.InvalidArgument(
            f"a device buffer is a CPU (shm_tensor) or CUDA tensor, not {device_of(tensor)}")
    if not tensor.is_contiguous():
        raise errors.InvalidArgument("a device buffer must be contiguous")
    buffer = _buffer_of(tensor)
    handle = buffer.handles.get(client.session_id)
    if handle is None:
        handle = client.pass_descriptor(buffer.fd)
        buffer.handles[client.session_id] = handle
    return shm.describe_passed(handle, tensor.data_ptr() - buffer.address,
                               tensor.numel() * tensor.element_size())


def device_of(tensor):
    return tensor.device.type


def device_buffers_for(client, k_layers, v_layers=()):
    """The (k, v) entry lists of a layer-first KV buffer set: per layer a
    tensor of token_slots rows (MHA K and V; MLA the latent in k_layers),
    shm_tensor views or CUDA tensors.

    Feed them to client.register_device_buffers(pool, token_slots, k, v).
    """
    k = [describe(client, t) for t in k_layers]
    v = [describe(client, t) for t in v_layers]
    return k, v


def mha_kv_buffer(num_layers, token_slots, num_kv_heads, head_dim, dtype):
    """One shm_tensor (2, L, S, H, D) and its per-layer K and V views."""
    kv = shm_tensor((2, num_layers, token_slots, num_kv_heads, head_dim), dtype)
    return kv, [kv[0, l] for l in range(num_layers)], [kv[1, l] for l in range(num_layers)]


def mla_kv_buffer(num_layers, token_slots, kv_dim, dtype):
    """One shm_tensor (L, S, 1, kv_dim) and its per-layer views."""
    kv = shm_tensor((num_layers, token_slots, 1, kv_dim), dtype)
    return kv, [kv[l] for l in range(num_layers)]


def pool_view(client, pool):
    """A zero-copy CPU tensor of pool `pool`'s host pages in SGLang's shape
    for its layout (its kv_buffer: MHA (2, ...), MLA without the K/V axis),
    through client.map_pool: writable for the pool's owner, read-only
    otherwise. The mapping lives as long as the tensor."""
    return client.map_pool(pool).kv_buffer()
