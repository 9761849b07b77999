"""How a remote host pool waits for its transfers: on the CPU in this
thread (the session's signal records), on CUDA on the current stream (GPU
signal words), so SGLang's per-layer events mean what they say.
"""


class HostWaits:
    """CPU device buffers: the calling thread blocks (futex, no spin)."""

    def __init__(self, client):
        self._client = client

    def gpu_signals(self):
        return None  # RegisterDeviceBuffersRequest.gpu_signals: none

    def attach(self, import_id):
        del import_id

    def mark_kv_written(self):
        return 0  # the engine's writes to CPU buffers are done already

    def wait_layer(self, op, layer):
        self._client.wait_layer(op, layer)

    def wait_all(self, op):
        self._client.wait(op)


def sync_for(client, device_tensor, num_layers):
    """The waits for device buffers like `device_tensor`."""
    if device_tensor.device.type == "cuda":
        from .cuda_waits import StreamWaits  # pylint: disable=import-outside-toplevel
        return StreamWaits(client, device_tensor.device.index or 0, num_layers)
    return HostWaits(client)
