"""hostkv.cuda where there is no GPU: the export's arithmetic and errors
through fake CUDA tensors (the seam is `_share_cuda_`), the clear errors of
GpuSignals and of the driver loader, and Client.fetch_kv_word against the
CPU daemon. The GPU half is tests/gpu/torch_e2e.py."""
import os
import subprocess
import sys
import types
import uuid

import pytest

import hostkv
import hostkv.cuda as hkc
import hostkv.torch as hkt
from hostkv import _cuda_driver, _cuda_export, errors

REAL_DEVICE_UUID = _cuda_export.device_uuid
HANDLE = bytes(range(64))
UUID = bytes(range(100, 116))
EXPANDABLE_ERROR = ("Tensors allocated with expandable_segments:True cannot be shared "
                    "between processes. Consider using expandable_segments:False")


class FakeStorage:
    """An untyped storage whose _share_cuda_ returns `handle` (or raises)."""

    def __init__(self, handle=HANDLE, offset_in_block=4096, error=None, ptr=0x7F0000000000):
        self.handle, self.offset_in_block, self.error, self.ptr = (
            handle, offset_in_block, error, ptr)
        self.shares = 0

    def data_ptr(self):
        return self.ptr

    def nbytes(self):
        return 1 << 20

    def _share_cuda_(self):
        self.shares += 1
        if self.error is not None:
            raise self.error
        return (1, self.handle, 1 << 20, self.offset_in_block, b"/torch_rc", 0, b"", True)


class FakeDevice:
    type = "cuda"

    def __init__(self, index):
        self.index = index


class FakeCudaTensor:
    """What export_cuda reads of a torch CUDA tensor."""

    is_cuda = True

    def __init__(self, storage, storage_offset=0, numel=256, element_size=2,
                 contiguous=True, device=1):
        self.storage, self._offset, self._numel, self._element = (
            storage, storage_offset, numel, element_size)
        self._contiguous = contiguous
        self.device = FakeDevice(device)

    def untyped_storage(self):
        return self.storage

    def storage_offset(self):
        return self._offset

    def numel(self):
        return self._numel

    def element_size(self):
        return self._element

    def is_contiguous(self):
        return self._contiguous


@pytest.fixture(autouse=True)
def fresh_exports(monkeypatch):
    monkeypatch.setattr(_cuda_export, "_exports", {})
    monkeypatch.setattr(_cuda_export, "device_uuid", lambda index: UUID)


def test_import_loads_neither_torch_nor_the_driver():
    code = ("import sys, hostkv.cuda, hostkv.torch\n"
            "from hostkv import _cuda_driver\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "assert _cuda_driver._driver is None\n"
            "maps = open('/proc/self/maps').read()\n"
            "assert 'libcuda' not in maps, 'libcuda was loaded'\n"
            "print('clean')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"


def test_cpu_tensor_is_invalid_argument():
    torch = pytest.importorskip("torch")
    with pytest.raises(errors.InvalidArgument, match="needs a CUDA tensor, not a cpu one"):
        hkc.export_cuda(torch.zeros(8))
    with pytest.raises(errors.InvalidArgument, match="needs a CUDA tensor"):
        hkc.export_cuda(b"not a tensor")


def test_versioned_handle_offset_size_and_device():
    storage = FakeStorage(handle=b"\x02c" + HANDLE)
    entry = hkc.export_cuda(FakeCudaTensor(storage, storage_offset=100))
    assert entry.cuda_ipc_handle == HANDLE
    assert entry.offset == 4096 + 100 * 2
    assert entry.size == 256 * 2
    assert (entry.device, entry.device_uuid) == (1, UUID)


def test_views_of_one_storage_share_it_once():
    storage = FakeStorage()
    first = hkc.export_cuda(FakeCudaTensor(storage, storage_offset=0))
    second = hkc.export_cuda(FakeCudaTensor(storage, storage_offset=512))
    assert storage.shares == 1
    assert (first.cuda_ipc_handle, second.cuda_ipc_handle) == (HANDLE, HANDLE)
    assert (first.offset, second.offset) == (4096, 4096 + 1024)


def test_non_contiguous_and_empty_are_refused_before_sharing():
    storage = FakeStorage()
    with pytest.raises(errors.InvalidArgument, match="contiguous"):
        hkc.export_cuda(FakeCudaTensor(storage, contiguous=False))
    with pytest.raises(errors.InvalidArgument, match="empty"):
        hkc.export_cuda(FakeCudaTensor(storage, numel=0))
    assert storage.shares == 0


def test_expandable_segments_say_what_to_unset():
    raised = FakeStorage(error=RuntimeError(EXPANDABLE_ERROR))
    with pytest.raises(errors.InvalidArgument,
                       match=r"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.*unset it"):
        hkc.export_cuda(FakeCudaTensor(raised))
    # Newer PyTorch shares expandable segments as a handle of kind 'e'.
    kind_e = FakeStorage(handle=b"\x02e" + bytes(40))
    with pytest.raises(errors.InvalidArgument, match="expandable_segments:True"):
        hkc.export_cuda(FakeCudaTensor(kind_e))


def test_other_share_failures_carry_torch_reason():
    storage = FakeStorage(error=RuntimeError("cudaMallocAsync does not yet support "
                                             "shareIpcHandle"))
    with pytest.raises(errors.InvalidArgument, match="cudaMallocAsync does not yet support"):
        hkc.export_cuda(FakeCudaTensor(storage))


@pytest.mark.parametrize("handle", [b"", bytes(63), b"\x02x" + HANDLE, b"\x02c" + HANDLE[:10]])
def test_handles_of_unknown_form(handle):
    with pytest.raises(errors.InvalidArgument, match="not a cudaIpcMemHandle"):
        hkc.ipc_handle_of(handle)


def test_torch_describe_takes_cuda_tensors():
    tensor = FakeCudaTensor(FakeStorage(), storage_offset=8)
    k, v = hkt.device_buffers_for(None, [tensor], [tensor])
    assert k[0] == v[0] == hkc.export_cuda(tensor)
    assert k[0].offset == 4096 + 16


@pytest.mark.parametrize("reported,raw", [
    (types.SimpleNamespace(bytes=list(UUID)), UUID),  # torch 2.x: _CUuuid.bytes
    ("GPU-" + str(uuid.UUID(bytes=UUID)), UUID),       # only a string
    (None, b""),                                       # no uuid: the ordinal names it
])
def test_device_uuid_is_16_raw_bytes(monkeypatch, reported, raw):
    props = types.SimpleNamespace(uuid=reported)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_device_properties=lambda index: props))
    monkeypatch.setattr(_cuda_export, "_torch", lambda: fake)
    monkeypatch.setattr(_cuda_export, "_uuids", {})
    assert REAL_DEVICE_UUID(3) == raw


def test_gpu_signals_without_cuda_is_a_clear_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tests/gpu/torch_e2e.py covers GpuSignals")
    with pytest.raises(errors.FailedPrecondition, match="sees no CUDA device"):
        hkc.GpuSignals(4)


def test_missing_driver_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(_cuda_driver, "_LIBRARY", "libhostkv-test-no-such-cuda.so.1")
    monkeypatch.setattr(_cuda_driver, "_driver", None)
    with pytest.raises(errors.FailedPrecondition, match="cannot load the CUDA driver"):
        _cuda_driver.driver()


STUB = "/usr/local/cuda/lib64/stubs/libcuda.so"


@pytest.mark.skipif(not os.path.exists(STUB), reason="no CUDA toolkit driver stub")
def test_driver_symbols_exist_in_the_toolkit_stub():
    # In a child: the stub's soname is libcuda.so.1, so it would stand in
    # for a real driver for the rest of this process.
    code = ("import hostkv\nfrom hostkv import _cuda_driver\n"
            f"_cuda_driver._LIBRARY = {STUB!r}\n"
            "try:\n    _cuda_driver.driver()\n"
            "except hostkv.errors.FailedPrecondition as e:\n    print(e.message)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    # Every symbol resolved (else "has no ..."); then cuInit failed cleanly.
    assert out.stdout.startswith("the CUDA driver does not start: cuInit:"), out.stdout


def test_fetch_kv_word_errors(client):
    torch = pytest.importorskip("torch")
    client.create_pool(hostkv.mha_pool_spec("kvword", num_layers=1, num_kv_heads=1,
                                            head_dim=8, page_size=4, capacity_tokens=16))
    kv, k, v = hkt.mha_kv_buffer(1, 8, 1, 8, torch.bfloat16)
    import_id = client.register_device_buffers("kvword", 8,
                                               *hkt.device_buffers_for(client, k, v))
    with pytest.raises(errors.FailedPrecondition, match="no KV-written word"):
        client.fetch_kv_word(import_id)
    with pytest.raises(errors.NotFound):
        client.fetch_kv_word(import_id + 1000)
    client.unregister_device_buffers(import_id)
    client.delete_pool("kvword")
    del kv
