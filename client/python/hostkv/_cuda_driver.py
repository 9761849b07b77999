"""The few CUDA driver functions hostkv.cuda needs, through ctypes.

libcuda.so.1 is opened at the first call of driver(), never at import, so
`import hostkv.cuda` works on machines without a driver. Every CUresult is
checked: a failed call raises hostkv.errors.Internal naming the call and
the driver's error (cuGetErrorName, cuGetErrorString). The names are those
cuda.h maps the plain ones to (`_v2` where it has one), looked up directly
in the library. Thread-safe.
"""
import ctypes
import threading

from . import errors

_LIBRARY = "libcuda.so.1"

# cuda.h values.
CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS = 122
CU_STREAM_WAIT_VALUE_GEQ = 0x0
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0
CU_MEMHOSTREGISTER_PORTABLE = 0x01
CU_MEMHOSTREGISTER_DEVICEMAP = 0x02

_p = ctypes.c_void_p
_u64 = ctypes.c_uint64
# name -> (symbols to try, argtypes); every function returns a CUresult.
_FUNCTIONS = {
    "cuInit": (("cuInit",), [ctypes.c_uint]),
    "cuGetErrorName": (("cuGetErrorName",), [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]),
    "cuGetErrorString": (("cuGetErrorString",),
                         [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]),
    "cuDeviceGet": (("cuDeviceGet",), [ctypes.POINTER(ctypes.c_int), ctypes.c_int]),
    "cuDeviceGetAttribute": (("cuDeviceGetAttribute",),
                             [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]),
    "cuDevicePrimaryCtxRetain": (("cuDevicePrimaryCtxRetain",),
                                 [ctypes.POINTER(_p), ctypes.c_int]),
    "cuDevicePrimaryCtxRelease": (("cuDevicePrimaryCtxRelease_v2",
                                   "cuDevicePrimaryCtxRelease"), [ctypes.c_int]),
    "cuCtxGetCurrent": (("cuCtxGetCurrent",), [ctypes.POINTER(_p)]),
    "cuCtxPushCurrent": (("cuCtxPushCurrent_v2",), [_p]),
    "cuCtxPopCurrent": (("cuCtxPopCurrent_v2",), [ctypes.POINTER(_p)]),
    "cuMemHostRegister": (("cuMemHostRegister_v2",), [_p, ctypes.c_size_t, ctypes.c_uint]),
    "cuMemHostUnregister": (("cuMemHostUnregister",), [_p]),
    "cuMemHostGetDevicePointer": (("cuMemHostGetDevicePointer_v2",),
                                  [ctypes.POINTER(_u64), _p, ctypes.c_uint]),
    "cuStreamWaitValue64": (("cuStreamWaitValue64_v2", "cuStreamWaitValue64"),
                            [_p, _u64, _u64, ctypes.c_uint]),
    "cuStreamWriteValue64": (("cuStreamWriteValue64_v2", "cuStreamWriteValue64"),
                             [_p, _u64, _u64, ctypes.c_uint]),
    "cuStreamSynchronize": (("cuStreamSynchronize",), [_p]),
}

_lock = threading.Lock()
_driver = None  # the Driver, once loaded


class Driver:
    """libcuda.so.1's functions; call(name, *args) checks the CUresult."""

    def __init__(self, library):
        self._functions = {}
        for name, (symbols, argtypes) in _FUNCTIONS.items():
            for symbol in symbols:
                fn = getattr(library, symbol, None)
                if fn is not None:
                    fn.restype = ctypes.c_int
                    fn.argtypes = argtypes
                    self._functions[name] = fn
                    break
            else:
                raise errors.FailedPrecondition(
                    f"the CUDA driver ({_LIBRARY}) has no {symbols[0]}: it is too old")

    def call(self, name, *args):
        """Calls `name`; Internal with the driver's error if it fails."""
        result = self._functions[name](*args)
        if result != 0:
            raise errors.Internal(f"{name}: {self.error_text(result)}")

    def error_text(self, result):
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        if (self._functions["cuGetErrorName"](result, ctypes.byref(name)) != 0
                or not name.value):
            return f"CUresult {result}"
        self._functions["cuGetErrorString"](result, ctypes.byref(text))
        return f"{name.value.decode()} ({(text.value or b'?').decode()})"


def driver():
    """The loaded and initialized driver. FailedPrecondition without
    libcuda.so.1, or if cuInit fails (e.g. CUDA_ERROR_NO_DEVICE)."""
    global _driver
    with _lock:
        if _driver is None:
            try:
                library = ctypes.CDLL(_LIBRARY)
            except OSError as e:
                raise errors.FailedPrecondition(
                    f"cannot load the CUDA driver {_LIBRARY}: {e} (no NVIDIA driver on "
                    "this machine?)") from None
            loaded = Driver(library)
            try:
                loaded.call("cuInit", 0)
            except errors.Internal as e:
                raise errors.FailedPrecondition(
                    f"the CUDA driver does not start: {e.message} (no GPU?)") from None
            _driver = loaded
        return _driver


class PrimaryContext:
    """A reference to device `ordinal`'s primary context (the one PyTorch
    and the CUDA runtime use), made current on the calling thread for the
    scope of `with current():`. release() drops the reference."""

    def __init__(self, ordinal):
        self.driver = driver()
        device = ctypes.c_int()
        self.driver.call("cuDeviceGet", ctypes.byref(device), ordinal)
        self.device = device.value
        context = _p()
        self.driver.call("cuDevicePrimaryCtxRetain", ctypes.byref(context), self.device)
        self.context = context.value

    def supports_64bit_stream_mem_ops(self):
        value = ctypes.c_int()
        self.driver.call("cuDeviceGetAttribute", ctypes.byref(value),
                         CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, self.device)
        return value.value != 0

    def current(self):
        return _Current(self)

    def release(self):
        if self.context is not None:
            self.context = None
            self.driver.call("cuDevicePrimaryCtxRelease", self.device)


class _Current:
    """Pushes the context unless it already is current; pops what it pushed."""

    def __init__(self, primary):
        self._primary = primary
        self._pushed = False

    def __enter__(self):
        if self._primary.context is None:
            raise errors.FailedPrecondition("the GPU signals were released")
        now = _p()
        self._primary.driver.call("cuCtxGetCurrent", ctypes.byref(now))
        if now.value != self._primary.context:
            self._primary.driver.call("cuCtxPushCurrent", _p(self._primary.context))
            self._pushed = True
        return self._primary.driver

    def __exit__(self, *exc):
        if self._pushed:
            popped = _p()
            self._primary.driver.call("cuCtxPopCurrent", ctypes.byref(popped))
