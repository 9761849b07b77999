"""GpuSignals' protocol without a GPU: a fake torch and a fake driver (the
seams: sys.modules["torch"] and _cuda_driver's loaded Driver) record what
it enqueues; the KV-written page is a real memfd, as the daemon sends."""
import contextlib
import os
import sys
import types

import pytest

import hostkv
from hostkv import _cuda_driver, _gpu_signals, errors

CONTEXT = 0x5EED
WORDS = 0x7F00_0000_1000
STREAM = 0xABC
DEVICE_OFFSET = 0x1000_0000_0000  # the fake page's device address = host + this


class FakeDriver:
    def __init__(self):
        self.calls = []

    def call(self, name, *args):
        values = tuple(getattr(a, "value", a) for a in args)
        self.calls.append((name,) + values)
        out = getattr(args[0], "_obj", None) if args else None  # a byref() out-parameter
        if name == "cuDevicePrimaryCtxRetain" or name == "cuCtxGetCurrent":
            out.value = CONTEXT
        elif name == "cuDeviceGet":
            out.value = args[1]
        elif name == "cuDeviceGetAttribute":
            out.value = 1
        elif name == "cuMemHostGetDevicePointer":
            out.value = args[1] + DEVICE_OFFSET

    def named(self, name):
        return [c[1:] for c in self.calls if c[0] == name]


class FakeWords:
    """torch.zeros on the GPU: its size, and views of its first words."""

    allocated = []  # the element counts of every allocation

    def __init__(self, size):
        self.size = size
        FakeWords.allocated.append(size)

    def __getitem__(self, index):
        assert isinstance(index, slice) and (index.start or 0) == 0
        return self  # a view from the first word: the same address

    def data_ptr(self):
        return WORDS


def fake_torch():
    cuda = types.SimpleNamespace(
        is_available=lambda: True, current_device=lambda: 0,
        device=lambda index: contextlib.nullcontext(), synchronize=lambda *a: None,
        Stream=lambda *a: types.SimpleNamespace(cuda_stream=0x5151),
        current_stream=lambda *a: types.SimpleNamespace(cuda_stream=STREAM),
        stream=lambda s: contextlib.nullcontext())
    return types.SimpleNamespace(cuda=cuda, int64="int64", __version__="fake",
                                 zeros=lambda size, **k: FakeWords(size))


class FakeClient:
    def __init__(self):
        self.page = os.memfd_create("kv-word", os.MFD_CLOEXEC)
        os.ftruncate(self.page, 4096)

    def fetch_kv_word(self, import_id):
        assert import_id == 7
        return os.dup(self.page)

    def kv_word(self):
        return int.from_bytes(os.pread(self.page, 8, 0), "little")


@pytest.fixture
def driver(monkeypatch):
    fake = FakeDriver()
    monkeypatch.setitem(sys.modules, "torch", fake_torch())
    monkeypatch.setattr(_cuda_driver, "_driver", fake)
    monkeypatch.setattr(_gpu_signals, "export_cuda",
                        lambda words: hostkv.pb.DeviceBuffer(offset=words.data_ptr()))
    return fake


def op(signal_value=5, layer_begin=1, num_layers=2):
    return hostkv.Operation(op_id=9, signal_index=0, layer_begin=layer_begin,
                            num_layers=num_layers, signal_value=signal_value)


def test_wait_layer_waits_geq_on_the_layer_word(driver):
    signals = _gpu_signals.GpuSignals(3)
    assert signals.buffer.offset == WORDS
    signals.wait_layer(op(), 2)  # the current stream
    signals.wait_layer(op(signal_value=6), 1, stream=0x77)
    assert driver.named("cuStreamWaitValue64") == [
        (STREAM, WORDS + 16, 5, _cuda_driver.CU_STREAM_WAIT_VALUE_GEQ),
        (0x77, WORDS + 8, 6, _cuda_driver.CU_STREAM_WAIT_VALUE_GEQ)]
    assert not driver.named("cuCtxPushCurrent")  # the primary context was current


def test_words_sit_in_a_2_mib_block_of_their_own(driver):
    FakeWords.allocated.clear()
    _gpu_signals.GpuSignals(3)
    assert FakeWords.allocated == [_gpu_signals.IPC_GRANULARITY // 8]
    assert _gpu_signals.IPC_GRANULARITY == 2 << 20


def test_a_picked_value_is_waited_for_and_completed_on_the_words(driver):
    """The pool's own signal values (TransferRequest.signal_value): the wait
    goes on the stream before the RPC returns; a failed submission writes
    its value into the layers' words on the release stream."""
    signals = _gpu_signals.GpuSignals(3)
    signals.wait_value(1, 12)
    assert driver.named("cuStreamWaitValue64") == [
        (STREAM, WORDS + 8, 12, _cuda_driver.CU_STREAM_WAIT_VALUE_GEQ)]
    for layer, value in ((3, 1), (0, 0)):
        with pytest.raises(hostkv.errors.InvalidArgument):
            signals.wait_value(layer, value)
    signals.complete_value(12, 1, 3)
    assert driver.named("cuStreamWriteValue64") == [
        (0x5151, WORDS + 8, 12, _cuda_driver.CU_STREAM_WRITE_VALUE_DEFAULT),
        (0x5151, WORDS + 16, 12, _cuda_driver.CU_STREAM_WRITE_VALUE_DEFAULT)]
    assert driver.named("cuStreamSynchronize") == [(0x5151,)]


def test_wait_layer_refuses_what_op_does_not_cover(driver):
    signals = _gpu_signals.GpuSignals(3)
    for layer in (0, 3):
        with pytest.raises(errors.InvalidArgument, match="covers layers"):
            signals.wait_layer(op(), layer)
    with pytest.raises(errors.InvalidArgument, match="no GPU signal"):
        signals.wait_layer(op(signal_value=0), 1)
    assert not driver.named("cuStreamWaitValue64")


def test_marks_count_up_on_the_registered_page(driver):
    signals = _gpu_signals.GpuSignals(3)
    with pytest.raises(errors.FailedPrecondition, match="attach_kv_word"):
        signals.mark_kv_written()
    client = FakeClient()
    signals.attach_kv_word(client, 7)
    (address, size, flags), = driver.named("cuMemHostRegister")
    assert size == 4096 and flags == 3  # portable | device-mapped
    assert (signals.mark_kv_written(), signals.mark_kv_written(STREAM + 1)) == (1, 2)
    assert driver.named("cuStreamWriteValue64") == [
        (STREAM, address + DEVICE_OFFSET, 1, 0), (STREAM + 1, address + DEVICE_OFFSET, 2, 0)]
    signals.attach_kv_word(client, 7)  # a new registration starts again at 1
    assert signals.mark_kv_written() == 1
    assert len(driver.named("cuMemHostUnregister")) == 1  # the first page went


def test_release_lets_every_wait_go_then_frees(driver):
    signals = _gpu_signals.GpuSignals(2)
    client = FakeClient()
    signals.attach_kv_word(client, 7)
    signals.release()
    assert client.kv_word() == _gpu_signals.RELEASED  # the CPU store the daemon sees
    assert driver.named("cuStreamWriteValue64") == [
        (0x5151, WORDS, _gpu_signals.RELEASED, 0), (0x5151, WORDS + 8, _gpu_signals.RELEASED, 0)]
    assert driver.named("cuStreamSynchronize") == [(0x5151,)]
    assert len(driver.named("cuMemHostUnregister")) == 1
    assert driver.named("cuDevicePrimaryCtxRelease") == [(0,)]
    signals.release()  # idempotent
    with pytest.raises(errors.FailedPrecondition, match="released"):
        signals.wait_layer(op(), 1)


def test_driver_errors_name_the_call(driver):
    def failing(name, *args):
        if name == "cuStreamWaitValue64":
            raise errors.Internal("cuStreamWaitValue64: CUDA_ERROR_INVALID_HANDLE (bad stream)")
        FakeDriver.call(driver, name, *args)
    driver.call = failing
    signals = _gpu_signals.GpuSignals(3)
    with pytest.raises(errors.Internal, match="CUDA_ERROR_INVALID_HANDLE"):
        signals.wait_layer(op(), 1)


def test_devices_without_64bit_stream_mem_ops_are_refused(driver):
    def no_mem_ops(name, *args):
        FakeDriver.call(driver, name, *args)
        if name == "cuDeviceGetAttribute":
            args[0]._obj.value = 0
    driver.call = no_mem_ops
    with pytest.raises(errors.FailedPrecondition, match="64-bit stream memory operations"):
        _gpu_signals.GpuSignals(3)
    assert driver.named("cuDevicePrimaryCtxRelease") == [(0,)]  # not leaked


class FakeFunction:
    """A ctypes function of a fake library: takes restype and argtypes."""

    def __init__(self, symbol):
        self.symbol = symbol

    def __call__(self, result, out):
        out._obj.value = {"cuGetErrorName": b"CUDA_ERROR_NO_DEVICE",
                          "cuGetErrorString": b"no CUDA-capable device is detected"}.get(
                              self.symbol, b"")
        return 0


def test_error_text_uses_the_driver_names():
    library = types.SimpleNamespace()
    for symbol, _ in _cuda_driver._FUNCTIONS.values():  # pylint: disable=protected-access
        setattr(library, symbol[0], FakeFunction(symbol[0]))
    text = _cuda_driver.Driver(library).error_text(100)
    assert text == "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"
