"""PyTorch CUDA tensors for hostkvd's CUDA backend (the twin of
hostkv/cuda_buffers.h: ExportCudaBuffer and GpuSignals).

    import hostkv, hostkv.cuda as hkc
    k = [torch.zeros(slots, heads, dim, dtype=torch.bfloat16, device="cuda")
         for _ in range(layers)]                     # v likewise (MLA: k only)
    kb, vb = hkc.device_buffers_for_cuda(k, v)       # cudaIpcMemHandles
    signals = hkc.GpuSignals(layers)                 # per-layer words, same GPU
    import_id = client.register_device_buffers(pool, slots, kb, vb,
                                               gpu_signals=signals.buffer)
    signals.attach_kv_word(client, import_id)        # the daemon's KV-written page
    # per batch: load, then each layer waits on the compute stream
    op = client.load(pool, import_id, pages, [(0, n)])
    for layer in range(layers):
        signals.wait_layer(op, layer)                # torch.cuda.current_stream()
        attention(layer)
    # backups start once the KV is written, without a host sync:
    client.backup(pool, import_id, pages, [(0, n)],
                  wait_kv_written=signals.mark_kv_written())
    ...
    client.unregister_device_buffers(import_id)
    signals.release()

hostkv.torch.describe / device_buffers_for take CUDA tensors too (through
export_cuda). torch and the CUDA driver (libcuda.so.1, through ctypes) are
loaded when first needed, so `import hostkv.cuda` works without either.

Limits:
  * Memory PyTorch allocates with expandable segments
    (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) has no
    cudaIpcMemHandle: export_cuda raises InvalidArgument for it.
  * Exporting goes through PyTorch's own CUDA IPC (`_share_cuda_`), which
    keeps a storage's memory allocated for the life of the process once it
    is shared, even after the tensor is freed (PyTorch waits for a consumer
    process to release it, and hostkvd is not a PyTorch process). Export
    the long-lived KV cache, not temporaries. Each storage is shared once; its views reuse that export.
  * wait_kv_written needs the KV-written page, which travels over the
    session socket: a unix: target.
"""
from ._cuda_export import (device_buffers_for_cuda, device_uuid, export_cuda,
                           ipc_handle_of)
from ._gpu_signals import RELEASED, GpuSignals

__all__ = ["GpuSignals", "RELEASED", "device_buffers_for_cuda", "device_uuid", "export_cuda",
           "ipc_handle_of"]
