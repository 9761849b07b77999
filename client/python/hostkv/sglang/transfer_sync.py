"""How a remote host pool waits for its transfers: on the CPU in this
thread (the session's signal records), on CUDA on the current stream (GPU
signal words), so SGLang's per-layer events mean what they say.

Both give the pool: gpu_signals() / attach(import_id) for the
registration; host_indices(t) (a CPU view of an index tensor, made without
blocking this thread); mark_kv_written(); signal_value() (the value the
next transfer's layers signal, 0: the daemon picks); wait_layer(pending,
layer) and wait_all(pending) on a transfer_submitter.Pending; failed(pending)
when its submission failed (True: the pool raises it at its next call).
"""


class HostIndices:
    """An index tensor that is on the CPU already."""

    def __init__(self, tensor):
        self._tensor = tensor

    def get(self):
        return self._tensor


class HostWaits:
    """CPU device buffers: the calling thread blocks (futex, no spin)."""

    asynchronous = False  # nothing to enqueue on: the RPC is made inline

    def __init__(self, client):
        self._client = client

    def gpu_signals(self):
        return None  # RegisterDeviceBuffersRequest.gpu_signals: none

    def attach(self, import_id):
        del import_id

    @staticmethod
    def host_indices(tensor):
        return HostIndices(tensor)

    def mark_kv_written(self):
        return 0  # the engine's writes to CPU buffers are done already

    def signal_value(self):
        return 0

    def wait_layer(self, pending, layer):
        self._client.wait_layer(pending.operation(), layer)

    def wait_all(self, pending):
        self._client.wait(pending.operation())

    def failed(self, pending):
        """Whether the pool must raise a failed submission itself: no, the
        waits on the host raise it."""
        del pending
        return False


def sync_for(client, device_tensor, num_layers):
    """The waits for device buffers like `device_tensor`."""
    if device_tensor.device.type == "cuda":
        from .cuda_waits import StreamWaits  # pylint: disable=import-outside-toplevel
        return StreamWaits(client, device_tensor.device.index or 0, num_layers)
    return HostWaits(client)
