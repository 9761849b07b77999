"""Waits on the engine's CUDA streams for a remote host pool (hostkv.cuda
GpuSignals): a per-layer load wait is a cuStreamWaitValue64 on the current
stream, so the event SGLang records after it fires once the layer is in
place; backups start after mark_kv_written on the current stream.

Nothing here blocks the calling thread: the pool picks each transfer's
signal value itself (TransferRequest.signal_value, increasing per import)
and enqueues the waits at once, while its submitter thread makes the RPC
(with gpu_waits_only: nothing on the host waits per layer, so the daemon
launches no per-layer host callback on its stream);
CUDA index tensors reach the host by a non-blocking copy into pinned memory
that the submitter thread waits for (HostIndicesCopy).
"""
import itertools
import threading

from .. import cuda


def _torch():
    import torch  # pylint: disable=import-outside-toplevel
    return torch


class HostIndicesCopy:
    """A CUDA index tensor copied to pinned host memory on the current
    stream; get() (on the submitter thread) waits for that copy only."""

    def __init__(self, tensor):
        torch = _torch()
        self._event = None
        if getattr(getattr(tensor, "device", None), "type", None) != "cuda":
            self._host = tensor
            return
        self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self._host.copy_(tensor, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def get(self):
        if self._event is not None:
            self._event.synchronize()
        return self._host


class StreamWaits:
    asynchronous = True  # the RPC leaves the scheduler thread

    def __init__(self, client, device_index, num_layers):
        self._client = client
        self._signals = cuda.GpuSignals(num_layers, device=device_index)
        # Fresh words are zero and the daemon starts above what they hold:
        # values from 1 on, increasing in submission order.
        self._values = itertools.count(1)
        self._lock = threading.Lock()
        if client.has_session_socket:
            # A dead daemon moves no signal word again: let the streams go.
            client.on_daemon_lost(self._signals.release_all)

    def gpu_signals(self):
        return self._signals.buffer

    def attach(self, import_id):
        self._signals.attach_kv_word(self._client, import_id)

    @staticmethod
    def host_indices(tensor):
        return HostIndicesCopy(tensor)

    def mark_kv_written(self):
        return self._signals.mark_kv_written()

    def signal_value(self):
        with self._lock:
            return next(self._values)

    def wait_layer(self, pending, layer):
        self._signals.wait_value(layer, pending.signal_value)

    def wait_all(self, pending):
        if pending.num_layers:
            self.wait_layer(pending, pending.layer_begin + pending.num_layers - 1)

    def failed(self, pending):
        """No copy will signal `pending`'s value: write it into its layers'
        words so the streams waiting for it go on (the pool then raises)."""
        self._signals.complete_value(pending.signal_value, pending.layer_begin,
                                     pending.layer_begin + pending.num_layers)
        return True
