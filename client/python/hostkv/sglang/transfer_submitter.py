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
import queue
import threading


class Submission:
    """A Future-alike of one submission: result() waits for it and
    returns or raises what fn() did."""

    __slots__ = ("_done", "_result", "_error")

    def __init__(self):
        self._done = None  # a threading.Event while it runs on the thread
        self._result = None
        self._error = None

    def run(self, fn):
        try:
            self._result = fn()
        except BaseException as e:  # pylint: disable=broad-except
            self._error = e
        if self._done is not None:
            self._done.set()

    def result(self, timeout=None):
        if self._done is not None and not self._done.wait(timeout):
            raise TimeoutError("the submission did not finish in time")
        if self._error is not None:
            raise self._error
        return self._result


class Pending:
    """A submitted load or backup: its layers, the signal value the pool
    picked (0: the daemon's, CPU), and the Operation once the call returns."""

    def __init__(self, layer_begin, num_layers, signal_value):
        self.future = None  # its Submission, once submitted
        self.layer_begin = layer_begin
        self.num_layers = num_layers
        self.signal_value = signal_value

    def operation(self, timeout=None):
        """The hostkv.Operation; raises what the submission raised."""
        return self.future.result(timeout)


class TransferSubmitter:
    """Runs submissions inline, or on one thread in order (asynchronous).
    Thread-safe. The calling thread only puts the call on a queue: it
    takes no lock the thread holds (that would hand the GIL to the
    thread's protobuf work for its whole RPC)."""

    def __init__(self, asynchronous, name):
        self.asynchronous = asynchronous
        self._name = name
        self._lock = threading.Lock()
        self._queue = None
        self._thread = None

    def submit(self, fn):
        """Runs fn() (inline or on the thread); returns its Submission."""
        submission = Submission()
        if not self.asynchronous:
            submission.run(fn)
            return submission
        submission._done = threading.Event()  # pylint: disable=protected-access
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._queue = queue.SimpleQueue()
                    self._thread = threading.Thread(target=self._serve, args=(self._queue,),
                                                    name=self._name, daemon=True)
                    self._thread.start()
        self._queue.put((fn, submission))
        return submission

    @staticmethod
    def _serve(work):
        while True:
            item = work.get()
            if item is None:
                return
            fn, submission = item
            submission.run(fn)

    def drain(self):
        """Waits for every submission made so far."""
        self.submit(lambda: None).result()

    def close(self):
        """Runs what was submitted, then stops the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._queue.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join()
