"""GpuSignals: an import's completion words in device memory (the twin of
hostkv::GpuSignals in hostkv/cuda_buffers.h, same protocol with hostkvd).
See hostkv.cuda for the whole picture.

  * num_layers uint64 words on the GPU (a torch int64 tensor, zeroed),
    exported like the KV buffers and registered as gpu_signals: the daemon's
    stream writes op.signal_value into word[l] once layer l of op is copied;
    wait_layer enqueues cuStreamWaitValue64(GEQ) on it.
  * the "KV written" word: the first 8 bytes of a 4 KiB page the daemon owns,
    fetched over the session socket (kFetchKvWord), mapped and registered
    with cuMemHostRegister (device-mapped); mark_kv_written enqueues
    cuStreamWriteValue64 of increasing values there, which transfers with
    wait_kv_written wait for.
"""
import ctypes
import importlib
import mmap
import os
import threading

from . import _cuda_driver, errors
from ._cuda_export import export_cuda

KV_WORD_PAGE_BYTES = 4096
# What CUDA IPC shares: whole driver blocks of 2 MiB (hostkv::kCudaIpcGranularity).
IPC_GRANULARITY = 2 << 20
# The largest value a wrapping GEQ wait sees as >= every signal value the
# daemon hands out (< 2^63): what release_all() writes.
RELEASED = (1 << 63) - 1
_U64 = (1 << 64) - 1


def _cuda_torch():
    try:
        torch = importlib.import_module("torch")
    except ImportError as e:
        raise errors.FailedPrecondition(f"GPU signals need torch: {e}") from None
    if not torch.cuda.is_available():
        raise errors.FailedPrecondition(
            f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() "
            "is False): GPU signals need one; wait on the host instead (Client.wait_layer)")
    return torch


class _KvWordPage:
    """The daemon's "KV written" page in this process: the memfd, its
    mapping and its CUDA registration (cuMemHostRegister, device-mapped)."""

    def __init__(self, fd, context):
        self._context = context
        self.fd = fd
        self._map = None
        self.address = None
        try:
            if os.fstat(fd).st_size < KV_WORD_PAGE_BYTES:
                raise errors.Internal("the daemon's KV-written page is not one 4 KiB page")
            self._map = mmap.mmap(fd, KV_WORD_PAGE_BYTES, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
            anchor = ctypes.c_char.from_buffer(self._map)
            address = ctypes.addressof(anchor)
            del anchor  # an export left open would keep the mmap from closing
            device = ctypes.c_uint64()
            with context.current() as driver:
                driver.call("cuMemHostRegister", address, KV_WORD_PAGE_BYTES,
                            _cuda_driver.CU_MEMHOSTREGISTER_PORTABLE
                            | _cuda_driver.CU_MEMHOSTREGISTER_DEVICEMAP)
                self.address = address
                driver.call("cuMemHostGetDevicePointer", ctypes.byref(device), address, 0)
            self.device_address = device.value
        except BaseException:
            self.close()
            raise

    def word(self):
        return ctypes.c_uint64.from_address(self.address)

    def close(self):
        try:
            if self.address is not None:
                address, self.address = self.address, None
                with self._context.current() as driver:
                    driver.call("cuMemHostUnregister", address)
        finally:
            if self._map is not None:
                self._map.close()
                self._map = None
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


def _device_index(torch, device):
    if isinstance(device, int):
        return device
    index = None if device is None else torch.device(device).index
    return torch.cuda.current_device() if index is None else index


class GpuSignals:
    """The GPU completion words of one import on device `device` (default:
    torch's current device): `buffer` is the DeviceBuffer to pass as
    register_device_buffers(..., gpu_signals=signals.buffer).

    FailedPrecondition without torch CUDA, without the driver, or on a
    device without 64-bit stream memory operations; Internal (naming the
    driver's error) if a driver call fails. Streams are torch streams
    (torch.cuda.Stream, default: the device's current stream) or raw
    cudaStream_t values. One GpuSignals per registration at a time; call
    release() only after the import is unregistered (or its client closed).
    Thread-safe.
    """

    def __init__(self, num_layers, device=None):
        torch = _cuda_torch()
        if num_layers < 0:
            raise errors.InvalidArgument(f"num_layers {num_layers} is negative")
        self._torch = torch
        self.num_layers = int(num_layers)
        self.device = _device_index(torch, device)
        self._lock = threading.Lock()  # guards _kv_word and _kv_written
        self._kv_word = None
        self._kv_written = 0
        self._context = _cuda_driver.PrimaryContext(self.device)
        try:
            if not self._context.supports_64bit_stream_mem_ops():
                raise errors.FailedPrecondition(
                    f"device {self.device} has no 64-bit stream memory operations "
                    "(cuStreamWaitValue64); wait on the host instead (Client.wait_layer)")
            with torch.cuda.device(self.device):
                # At least one word, so that there is an allocation to
                # export; in a 2 MiB block of its own (torch's large pool):
                # CUDA IPC shares a whole block, and a small tensor's block
                # holds the engine's other small tensors.
                block = torch.zeros(IPC_GRANULARITY // 8, dtype=torch.int64,
                                    device=f"cuda:{self.device}")
                self.words = block[:max(self.num_layers, 1)]
                torch.cuda.synchronize(self.device)
                self._release_stream = torch.cuda.Stream(self.device)
            self.buffer = export_cuda(self.words)
        except BaseException:
            self._context.release()
            raise

    def attach_kv_word(self, client, import_id):
        """Fetches the "KV written" page of `import_id` (registered with
        `buffer`) from the daemon, maps it and registers it with CUDA. Call
        once per registration, before the first mark_kv_written; a later
        call replaces the page. Errors of Client.fetch_kv_word, or Internal."""
        page = _KvWordPage(client.fetch_kv_word(import_id), self._context)
        with self._lock:
            old, self._kv_word = self._kv_word, page
            self._kv_written = 0  # a fresh page starts at nothing written
        if old is not None:
            self._torch.cuda.synchronize(self.device)  # no mark still queued for it
            old.close()

    def wait_layer(self, op, layer, stream=None):
        """Enqueues on `stream` a wait until layer `layer` (absolute) of `op`
        (a load or backup of this import) is copied: cuStreamWaitValue64 on
        the layer's word reaching op.signal_value, no host round trip.

        InvalidArgument if `op` does not cover `layer` or has no signal value
        (its import was registered without gpu_signals).
        """
        if (layer < op.layer_begin or layer - op.layer_begin >= op.num_layers
                or layer >= self.num_layers):
            raise errors.InvalidArgument(
                f"operation {op.op_id} covers layers [{op.layer_begin}, "
                f"{op.layer_begin + op.num_layers}), not layer {layer}")
        if op.signal_value == 0:
            raise errors.InvalidArgument(
                f"operation {op.op_id} has no GPU signal (its import was registered "
                "without gpu_signals)")
        raw = self._raw_stream(stream)
        with self._context.current() as driver:
            driver.call("cuStreamWaitValue64", ctypes.c_void_p(raw),
                        self.words.data_ptr() + 8 * layer, op.signal_value,
                        _cuda_driver.CU_STREAM_WAIT_VALUE_GEQ)

    def wait_value(self, layer, value, stream=None):
        """Enqueues on `stream` a wait until layer `layer`'s word reaches
        `value` (a signal value this engine gave a transfer:
        TransferRequest.signal_value), before the transfer's RPC returns.
        InvalidArgument for a layer outside the words or a value of 0."""
        if not 0 <= layer < self.num_layers or value <= 0:
            raise errors.InvalidArgument(
                f"no wait for layer {layer} (of {self.num_layers}) at value {value}")
        raw = self._raw_stream(stream)
        with self._context.current() as driver:
            driver.call("cuStreamWaitValue64", ctypes.c_void_p(raw),
                        self.words.data_ptr() + 8 * layer, value,
                        _cuda_driver.CU_STREAM_WAIT_VALUE_GEQ)

    def complete_value(self, value, layer_begin, layer_end):
        """Writes `value` into the words of layers [layer_begin, layer_end)
        on a stream of its own, and waits for it: for a transfer whose
        submission failed, so that streams waiting for its value go on (the
        KV they wait for is not there). Words never decrease: later
        transfers use larger values."""
        raw = self._release_stream.cuda_stream
        with self._context.current() as driver:
            for layer in range(max(0, layer_begin), min(layer_end, self.num_layers)):
                driver.call("cuStreamWriteValue64", ctypes.c_void_p(raw),
                            self.words.data_ptr() + 8 * layer, value,
                            _cuda_driver.CU_STREAM_WRITE_VALUE_DEFAULT)
            driver.call("cuStreamSynchronize", ctypes.c_void_p(raw))

    def mark_kv_written(self, stream=None):
        """Enqueues on `stream` a write of the next "KV written" value and
        returns it: a transfer with wait_kv_written=<that value> starts after
        the work enqueued on `stream` before this call. FailedPrecondition
        before attach_kv_word."""
        raw = self._raw_stream(stream)
        with self._lock:
            if self._kv_word is None:
                raise errors.FailedPrecondition(
                    "mark_kv_written: fetch the daemon's KV-written page first "
                    "(attach_kv_word after register_device_buffers)")
            value = self._kv_written + 1
            with self._context.current() as driver:
                driver.call("cuStreamWriteValue64", ctypes.c_void_p(raw),
                            self._kv_word.device_address, value,
                            _cuda_driver.CU_STREAM_WRITE_VALUE_DEFAULT)
            self._kv_written = value
        return value

    def release_all(self, stream=None):
        """Releases every wait on these words for good: stores 2^63 - 1 into
        "KV written" from the CPU and writes it into every layer word on
        `stream` (default: a stream of its own, so that a stream blocked in
        wait_layer does not hold the release up), then waits for the writes.
        For when the daemon is gone: no word would move again. Loads still
        waited for are then garbage (Client.wait reports them failed)."""
        with self._lock:
            if self._kv_word is not None:
                self._kv_word.word().value = RELEASED
        raw = self._release_stream.cuda_stream if stream is None else self._raw_stream(stream)
        with self._context.current() as driver:
            for layer in range(self.num_layers):
                driver.call("cuStreamWriteValue64", ctypes.c_void_p(raw),
                            self.words.data_ptr() + 8 * layer, RELEASED,
                            _cuda_driver.CU_STREAM_WRITE_VALUE_DEFAULT)
            driver.call("cuStreamSynchronize", ctypes.c_void_p(raw))

    def read_word(self, index):
        """Word `index` (a layer, or num_layers for "KV written": 0 before
        attach_kv_word), read from the host now; for tests and diagnostics."""
        if not 0 <= index <= self.num_layers:
            raise errors.InvalidArgument(f"no word {index}")
        if index == self.num_layers:
            with self._lock:
                return 0 if self._kv_word is None else self._kv_word.word().value
        with self._torch.cuda.stream(self._release_stream):
            return int(self.words[index].item()) & _U64

    def release(self):
        """Lets every wait go (release_all), waits for the device, then
        unregisters and unmaps the KV-written page. Idempotent.
        REQUIRES: the import is unregistered or its client closed."""
        if self._context.context is None:
            return
        self.release_all()
        self._torch.cuda.synchronize(self.device)  # no mark still queued for the page
        with self._lock:
            page, self._kv_word = self._kv_word, None
        if page is not None:
            page.close()
        self._context.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def _raw_stream(self, stream):
        if stream is None:
            return self._torch.cuda.current_stream(self.device).cuda_stream
        if isinstance(stream, int):
            return stream
        index = getattr(getattr(stream, "device", None), "index", self.device)
        if index is not None and index != self.device:
            raise errors.InvalidArgument(
                f"the stream is on device {index}, these signals on device {self.device}")
        return stream.cuda_stream
