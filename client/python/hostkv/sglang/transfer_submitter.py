"""Where a remote host pool makes its Load/Backup calls.

SGLang's controller issues loads and backups inline on its scheduler
thread. On CUDA the pool only enqueues work on the engine's streams (a
"KV written" mark, one stream wait per layer on a signal value it picks
itself), and a TransferSubmitter makes the gRPC call on a thread of its
own, in submission order: the scheduler thread never waits for a round
trip or for a device-to-host copy of the index tensors. On the CPU backend
there is no stream to enqueue on (each per-layer call waits for its layer
on the host anyway), so the call is made inline unless asked otherwise
(async_submit=True, $HOSTKV_ASYNC_SUBMIT=1).

A submission that fails (bad indices, the daemon refused or is gone) is
reported by its Pending: result() raises it; on CUDA the pool's waits are
released and the error is raised by the pool's next call.
"""
import concurrent.futures
import threading


class _Done:
    """A Future-alike of a call made inline."""

    def __init__(self, fn):
        self._result, self._error = None, None
        try:
            self._result = fn()
        except BaseException as e:  # pylint: disable=broad-except
            self._error = e

    def result(self, timeout=None):
        del timeout
        if self._error is not None:
            raise self._error
        return self._result

    def exception(self, timeout=None):
        del timeout
        return self._error

    def add_done_callback(self, fn):
        fn(self)


class Pending:
    """A submitted load or backup: its layers, the signal value the pool
    picked (0: the daemon's, CPU), and the Operation once the call returns."""

    def __init__(self, future, layer_begin, num_layers, signal_value):
        self.future = future
        self.layer_begin = layer_begin
        self.num_layers = num_layers
        self.signal_value = signal_value

    def operation(self, timeout=None):
        """The hostkv.Operation; raises what the submission raised."""
        return self.future.result(timeout)


class TransferSubmitter:
    """Runs submissions inline, or on one thread in order (asynchronous).
    Thread-safe."""

    def __init__(self, asynchronous, name):
        self.asynchronous = asynchronous
        self._name = name
        self._lock = threading.Lock()
        self._executor = None

    def submit(self, fn):
        """Runs fn() (inline or on the thread); returns a Future of it."""
        if not self.asynchronous:
            return _Done(fn)
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=self._name)
            return self._executor.submit(fn)

    def drain(self):
        """Waits for every submission made so far."""
        self.submit(lambda: None).result()

    def close(self):
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
