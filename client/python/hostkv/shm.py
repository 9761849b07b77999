"""Device KV buffers for the CPU backend (the twin of hostkv::ShmDeviceBuffer).

    buf = hostkv.shm.SealedBuffer(size)          # a sealed memfd, mapped
    handle = client.pass_descriptor(buf.fd)
    entry = hostkv.shm.describe_passed(handle, offset, nbytes)
"""
import ctypes
import fcntl
import mmap
import os

from . import errors
from ._proto import hostkv_pb2 as pb


class SealedBuffer:
    """A zeroed memfd of `size` bytes sealed against shrinking
    (F_SEAL_SHRINK | F_SEAL_SEAL), mapped read-write.

    Nobody else can open it by name and it cannot be truncated under the
    daemon's copies: pass `fd` with Client.pass_descriptor. Owns the fd and
    the mapping (close(), or when collected). Not thread-safe to close while
    in use.
    """

    def __init__(self, size):
        if size <= 0:
            raise errors.InvalidArgument(f"a sealed buffer needs a positive size, not {size}")
        fd = os.memfd_create("hostkv-device-buffer",
                             os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
            self.mmap = mmap.mmap(fd, size, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            os.close(fd)
            raise errors.Internal(f"sizing/sealing/mapping a memfd: {e.strerror}") from None
        self.fd = fd
        self.size = size
        self.name = f"memfd:{fd}"
        self.view = memoryview(self.mmap)
        anchor = ctypes.c_char.from_buffer(self.mmap)
        self.address = ctypes.addressof(anchor)  # where the mapping starts
        del anchor  # an export left open would keep mmap.close() from working
        self.handles = {}  # Client session_id -> passed_fd handle (hostkv.torch)

    def fileno(self):
        return self.fd

    def close(self):
        """Unmaps and closes. REQUIRES: no view of the buffer is still in use."""
        if self.fd < 0:
            return
        self.view.release()
        try:
            self.mmap.close()
        except BufferError:
            pass  # a tensor still shares the mapping: it goes with the tensor
        os.close(self.fd)
        self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if self.fd >= 0:
                os.close(self.fd)
        except (AttributeError, OSError):
            pass


def describe_passed(handle, offset, size):
    """The registration entry for bytes [offset, offset + size) of a buffer
    passed as `handle` (Client.pass_descriptor)."""
    return pb.DeviceBuffer(passed_fd=handle, offset=offset, size=size)


def describe_shm(shm_name, offset, size):
    """The entry for a named POSIX shared-memory segment ("/name")."""
    return pb.DeviceBuffer(shm_name=shm_name, offset=offset, size=size)


def describe_cuda(ipc_handle, offset, size, device=0, device_uuid=b""):
    """The entry for CUDA memory: `ipc_handle` the 64 bytes of a
    cudaIpcMemHandle_t (InvalidArgument otherwise)."""
    ipc_handle = bytes(ipc_handle)
    if len(ipc_handle) != 64:
        raise errors.InvalidArgument(
            f"a cudaIpcMemHandle_t has 64 bytes, not {len(ipc_handle)}")
    return pb.DeviceBuffer(cuda_ipc_handle=ipc_handle, offset=offset, size=size,
                           device=device, device_uuid=bytes(device_uuid))
