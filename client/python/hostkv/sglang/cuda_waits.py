"""Waits on the engine's CUDA streams for a remote host pool (hostkv.cuda
GpuSignals): a per-layer load wait is a cuStreamWaitValue64 on the current
stream, so the event SGLang records after it fires once the layer is in
place; backups start after mark_kv_written on the current stream."""
from .. import cuda


class StreamWaits:
    def __init__(self, client, device_index, num_layers):
        self._client = client
        self._signals = cuda.GpuSignals(num_layers, device=device_index)
        if client.has_session_socket:
            # A dead daemon moves no signal word again: let the streams go.
            client.on_daemon_lost(self._signals.release_all)

    def gpu_signals(self):
        return self._signals.buffer

    def attach(self, import_id):
        self._signals.attach_kv_word(self._client, import_id)

    def mark_kv_written(self):
        return self._signals.mark_kv_written()

    def wait_layer(self, op, layer):
        self._signals.wait_layer(op, layer)

    def wait_all(self, op):
        if op.num_layers:
            self._signals.wait_layer(op, op.layer_begin + op.num_layers - 1)
