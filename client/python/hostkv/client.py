"""hostkv.Client: one session with hostkvd (the Python twin of hostkv::Client).

    with hostkv.Client("unix:/run/hostkv/hostkvd.sock", "engine-rank0") as c:
        pool = c.create_pool(spec)
        import_id = c.register_device_buffers(pool.spec.name, slots, k, v)
        pages = c.alloc(pool.spec.name, 64)            # [(first, count), ...]
        op = c.backup(pool.spec.name, import_id, pages, [(0, 64)])
        c.wait(op)                                     # or wait_layer
        c.publish(pool.spec.name, "my-model", keys, pages)  # the page cache
        hits, cached = c.lookup(pool.spec.name, "my-model", keys, acquire=True)

Every failure raises the hostkv.errors class named after its status code.
Everything the session allocates or registers is released on close() (or
when this process dies: on a unix: target the session lives as long as its
session socket). Thread-safe: gRPC stubs are, and session-socket exchanges
are serialized by a lock.
"""
import atexit
import dataclasses
import logging
import os
import select
import sys
import threading
import time
import weakref

import grpc

from . import (_command_ring, _daemon_contact, _resume, _session_socket, _signals, _target,
               errors, pool_mapping)
from .cache_calls import CacheCalls, HeldReferences
from ._proto import hostkv_pb2 as pb
from ._proto import hostkv_pb2_grpc as pb_grpc

DEFAULT_TARGET = _target.DEFAULT_TARGET
_CALL_TIMEOUT = 60.0
_MAX_MESSAGE = 256 << 20
# How long calls wait for a daemon that does not answer (server/README.md "While
# hostkvd is away"); HOSTKV_RECONNECT_TIMEOUT overrides it.
DEFAULT_RECONNECT_TIMEOUT = 30.0
# The channel's reconnect backoff (first, most) and its handshake timeout.
_RECONNECT_BACKOFF_MS = (20, 100)
_CONNECT_TIMEOUT_MS = 2000


def _reconnect_timeout(value):
    if value is not None:
        return float(value)
    return float(os.environ.get("HOSTKV_RECONNECT_TIMEOUT", DEFAULT_RECONNECT_TIMEOUT))


@dataclasses.dataclass(frozen=True)
class Operation:
    """A submitted load or backup (TransferResponse)."""
    op_id: int
    signal_index: int
    layer_begin: int
    num_layers: int
    num_tokens: int = 0
    bytes: int = 0
    # CUDA imports with GPU signals: each layer's signal word takes this value.
    signal_value: int = 0
    # The signal segment of the daemon that answered the submission (its
    # TransferResponse.signal_segment_id): the operation is waited for there
    # only. One that daemon had not finished when it went is submitted again
    # (its request) when the session resumes, and waited for as that.
    segment: object = 0
    request: object = dataclasses.field(default=None, compare=False, repr=False)
    method: str = dataclasses.field(default="", compare=False, repr=False)


# Clients still open at interpreter exit are closed while threads still run
# (grpc's channel close waits for its own threads; from __del__ during
# interpreter teardown it would wait forever).
_open_clients = weakref.WeakSet()


@atexit.register
def _close_open_clients():
    for c in list(_open_clients):
        if c._pid != os.getpid():  # pylint: disable=protected-access
            continue  # a forked child's copy: the session is its parent's
        try:
            c.close()
        except Exception:  # pylint: disable=broad-except
            pass


def _runs(pages, message):
    return [message(first_page=f, num_pages=n) for f, n in pages]


def _pairs(runs):
    flat = []
    for first, count in runs:
        flat.append(first)
        flat.append(count)
    return flat


class Client(CacheCalls):
    """A session with hostkvd at `target` ("unix:PATH", "HOST:PORT" or
    "tcp:PORT"; None: $HOSTKV_TARGET, else unix:/run/hostkv/hostkvd.sock).

    On a unix: target the session is opened over the session socket, bound
    to this process's uid, and ends by itself if this process dies; over
    TCP it is opened with OpenSession and a thread renews its lease every
    lease/3. The page cache's calls (publish, lookup, release, copy_pages)
    come from hostkv.cache_calls.CacheCalls. Raises Unavailable if the
    daemon cannot be reached, InvalidArgument for a client_name of more
    than 200 bytes, Unauthenticated without the daemon's token.

    Once connected, a call that finds the daemon gone waits for it up to
    `reconnect_timeout` seconds (default 30, HOSTKV_RECONNECT_TIMEOUT; 0:
    no wait), then raises errors.DaemonUnavailable; `daemon_away` says
    whether the last contact failed. A daemon that adopted its
    predecessor's state (deploy/README.md "Restarts and upgrades") gets the session
    resumed (unix: targets): its pages are as they were, its descriptors
    and imports are passed and registered again under the same ids, and
    wait/wait_layer submit again the loads and backups that had not
    finished. What does not survive: references on cached pages (look the
    keys up again) and fetched KV words. A daemon that comes back without
    this session raises errors.SessionLost, from then on for every call.
    """

    def __init__(self, target=None, client_name="python", auth_token=None,
                 connect_timeout=5.0, reconnect_timeout=None, command_ring=None):
        self._lock = threading.Lock()  # guards _socket and _open
        self._socket = None
        self._ring = None
        if command_ring is None:
            command_ring = os.environ.get("HOSTKV_COMMAND_RING", "1") != "0"
        self._want_ring = bool(command_ring) and _command_ring.SUPPORTED
        self._open = False
        self._signals = None
        self._stop_renewing = threading.Event()
        self._renewer = None
        self._on_lost = []
        self._pid = os.getpid()
        self._watcher = None
        self._watch_wake = None  # (read fd, write fd) of the watcher's pipe
        self._channel = None
        self._metadata = (("authorization", f"Bearer {auth_token}"),) if auth_token else None
        self.session_id = b""
        self.session_number = 0
        self._records = _resume.SessionRecords()
        self._resume_lock = threading.Lock()
        self._gate = _resume.CallGate()
        self._held = HeldReferences()
        target = _target.resolve(target)
        self._contact = _daemon_contact.DaemonContact(target,
                                                      _reconnect_timeout(reconnect_timeout))
        name = client_name.encode("utf-8")
        self._client_name_bytes = name
        unix_socket = target.startswith("unix:")
        self._socket_path = target[5:] if unix_socket else None
        if unix_socket:
            self._contact.resume = self._resume_session
        if unix_socket:
            _target.check_socket(target[5:])
        if len(name) >= _session_socket.CLIENT_NAME_BYTES:
            raise errors.InvalidArgument("client_name is longer than 200 bytes")
        self._channel = grpc.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            ("grpc.enable_http_proxy", 0),
            # A restarted daemon is found within ~0.1 s, not gRPC's default
            # backoff of up to 2 minutes (a refused connect to a local
            # socket costs microseconds). min_reconnect_backoff is also the
            # shortest time a connection attempt gets to complete its
            # handshake: a busy daemon must not be given up on after 100 ms.
            ("grpc.initial_reconnect_backoff_ms", _RECONNECT_BACKOFF_MS[0]),
            ("grpc.max_reconnect_backoff_ms", _RECONNECT_BACKOFF_MS[1]),
            ("grpc.min_reconnect_backoff_ms", _CONNECT_TIMEOUT_MS)])
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            self._channel = None
            raise errors.Unavailable(
                f"cannot reach hostkvd at {target} (is it running? is the socket path "
                "right?)") from None
        self._stub = pb_grpc.HostKVStub(self._channel)
        self._ring_methods = {
            self._stub.Alloc: (_command_ring.METHODS["Alloc"], pb.AllocResponse),
            self._stub.Free: (_command_ring.METHODS["Free"], pb.FreeResponse),
            self._stub.Load: (_command_ring.METHODS["Load"], pb.TransferResponse),
            self._stub.Backup: (_command_ring.METHODS["Backup"], pb.TransferResponse),
            self._stub.Lookup: (_command_ring.METHODS["Lookup"], pb.LookupResponse),
            self._stub.Release: (_command_ring.METHODS["Release"], pb.ReleaseResponse),
            self._stub.Publish: (_command_ring.METHODS["Publish"], pb.PublishResponse),
        }
        _open_clients.add(self)
        try:
            if unix_socket:
                self._open_over_session_socket(target[5:], name)
            else:
                self._open_over_rpc(client_name)
        except BaseException:
            self.close()
            raise

    # -- session ---------------------------------------------------------

    def _open_over_session_socket(self, socket_path, name):
        sock = _session_socket.connect(socket_path)
        try:
            reply = _session_socket.exchange(
                sock, _session_socket.message(_session_socket.KIND_OPEN, client_name=name))
        except BaseException:
            sock.close()
            raise
        if reply.fd < 0:
            sock.close()
            raise errors.Internal("the daemon sent no signal segment")
        try:
            self._signals = _signals.SignalSegment(reply.fd, reply.signal_slots)
        except BaseException:
            sock.close()
            raise
        finally:
            os.close(reply.fd)
        self.session_id = bytes(reply.session_id)
        self.session_number = reply.session_number
        self._records.use_segment(reply.value, self._signals)
        with self._lock:
            self._socket = sock
            self._open = True
        self._ring = self._open_ring(sock, reply.features)
        self._route_ring_extras(reply.features)

    def _route_ring_extras(self, features):
        """Sends ListEvictions through the ring when the daemon's ring
        serves it (an older daemon's does not)."""
        if features & _session_socket.FEATURE_RING_LIST_EVICTIONS:
            self._ring_methods[self._stub.ListEvictions] = (
                _command_ring.METHODS["ListEvictions"], pb.ListEvictionsResponse)
        else:
            self._ring_methods.pop(self._stub.ListEvictions, None)

    def _open_ring(self, sock, features):
        """The session's command ring on `sock`, or None (not wanted, not
        served, or refused: the calls then go over gRPC)."""
        if not self._want_ring or not features & _session_socket.FEATURE_COMMAND_RING:
            return None
        try:
            reply = _session_socket.exchange(
                sock, _session_socket.message(_session_socket.KIND_OPEN_COMMAND_RING))
        except errors.HostKVError as e:
            logging.getLogger("hostkv").info("hostkv: no command ring (%s); calls use gRPC", e)
            return None
        if reply.fd < 0:
            return None
        try:
            return _command_ring.CommandRing(reply.fd, reply.value, self._hung_up)
        finally:
            os.close(reply.fd)

    @property
    def uses_command_ring(self):
        """True while the hot calls go through the session's command ring."""
        return self._ring is not None

    @property
    def command_ring_calls(self):
        """Calls answered through the command ring so far; -1 without one."""
        ring = self._ring
        return -1 if ring is None else ring.calls

    def _open_over_rpc(self, client_name):
        response = self._call(self._stub.OpenSession, pb.OpenSessionRequest(
            client_name=client_name, pid=os.getpid()))
        self.session_id = response.session_id
        self.session_number = response.session_number
        with self._lock:
            self._open = True
        period = max(1, response.lease_seconds) / 3.0
        self._renewer = threading.Thread(target=self._renew, args=(period,),
                                         name="hostkv-renew", daemon=True)
        self._renewer.start()
        name = response.signal_segment
        try:
            fd = os.open("/dev/shm/" + name.lstrip("/"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise errors.from_code(errors.NotFound.code if e.errno == 2 else
                                   errors.Internal.code,
                                   f"cannot open the signal segment {name}: {e.strerror}") from None
        try:
            self._signals = _signals.SignalSegment(fd, response.signal_slots)
        finally:
            os.close(fd)
        self._records.use_segment(response.signal_segment_id, self._signals)

    def _renew(self, period):
        request = pb.RenewSessionRequest(session_id=self.session_id)
        while not self._stop_renewing.wait(period):
            try:
                self._call(self._stub.RenewSession, request, wait=False)
            except errors.HostKVError:
                pass  # the next period tries again; the lease says how long

    def on_daemon_lost(self, fn):
        """Calls `fn()` once, on a thread of the client's, if the session
        socket hangs up while the session is open: the daemon died or ended
        the session. An engine with GPU signals passes
        GpuSignals.release_all, since no word its streams wait on would move
        again. Not called for close(). Callbacks added later join the same
        watch. FailedPrecondition over TCP (no session socket).
        """
        with self._lock:
            if self._socket is None:
                raise errors.FailedPrecondition(
                    "on_daemon_lost needs the session socket: connect to a unix: target")
            self._on_lost.append(fn)
            if self._watcher is not None:
                return
            self._watch_wake = os.pipe2(os.O_CLOEXEC)
            self._watcher = threading.Thread(
                target=self._watch, args=(self._socket.fileno(), self._watch_wake[0]),
                name="hostkv-watch", daemon=True)
            self._watcher.start()

    def _watch(self, session_fd, wake_fd):
        # Hang-up only (POLLRDHUP, not POLLIN): replies are left to the
        # exchange that waits for them.
        poller = select.poll()
        poller.register(session_fd, select.POLLRDHUP)
        poller.register(wake_fd, select.POLLIN)
        while True:
            events = dict(poller.poll())
            if wake_fd in events:
                return  # close()
            if events.get(session_fd, 0) & (select.POLLRDHUP | select.POLLHUP | select.POLLERR):
                break
        with self._lock:
            lost = self._open
            callbacks = list(self._on_lost)
        if lost:
            self._contact.mark_away("the session socket hung up")
            for fn in callbacks:
                try:
                    fn()
                except Exception:  # pylint: disable=broad-except
                    logging.getLogger("hostkv").exception("an on_daemon_lost callback failed")

    def _stop_watching(self):
        if self._watcher is None:
            return
        os.write(self._watch_wake[1], b"x")
        if self._watcher is not threading.current_thread():
            self._watcher.join()
        for fd in self._watch_wake:
            os.close(fd)
        self._watcher = None

    def close(self):
        """Closes the session: the daemon frees its pages and imports. Idempotent."""
        self._stop_renewing.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()
        with self._lock:
            was_open, self._open = self._open, False
        self._stop_watching()
        error = None
        if was_open and self._contact.lost is None:
            try:
                self._call(self._stub.CloseSession,
                           pb.CloseSessionRequest(session_id=self.session_id), wait=False)
            except (errors.Unavailable, errors.SessionLost):
                pass  # the daemon is gone, and the session with it
            except errors.HostKVError as e:
                error = e
        with self._lock:
            if self._socket is not None:
                self._socket.close()
                self._socket = None
        ring, self._ring = self._ring, None
        if ring is not None:
            ring.close()
        if getattr(self, "_channel", None) is not None:
            self._channel.close()
            self._channel = None
        self._records.close()
        if error is not None:
            raise error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # Like ~Client. During interpreter teardown nothing is closed: the
        # process's exit closes the session socket, which ends the session.
        if sys.is_finalizing() or getattr(self, "_pid", None) != os.getpid():
            return  # at teardown, or a forked child's copy of the parent's client
        try:
            self.close()
        except Exception:  # pylint: disable=broad-except
            pass

    def _call(self, method, request, wait=True, on_answer=None):
        """One call; waits for an absent daemon (wait, reconnect_timeout)."""
        return self._contact.call(
            lambda patience: self._call_once(method, request, on_answer, patience), wait)

    def _call_once(self, method, request, on_answer=None, patience=None):
        """One try of a call: its response, or on_answer(response) taken
        before a resume may change what the answering daemon was. With
        `patience` (the daemon was away), first waits up to that many
        seconds for the channel to connect (Unavailable if it does not)."""
        if patience is not None:
            self._await_channel(patience)
        counted = self._gate.enter()
        try:
            response = self._try(method, request)
            return response if on_answer is None else on_answer(response)
        finally:
            self._gate.leave(counted)

    def _await_channel(self, patience):
        """Returns once hostkvd listens (a RenewSession sent with
        wait_for_ready gets any answer), drives the channel's reconnect;
        Unavailable if it does not within `patience` seconds. (No
        connectivity watch: its polling thread would outlive the channel.)"""
        if self._channel is None:
            raise errors.FailedPrecondition("the client is closed")
        try:
            self._stub.RenewSession(pb.RenewSessionRequest(session_id=self.session_id),
                                    timeout=max(patience, 0.001), wait_for_ready=True,
                                    metadata=self._metadata)
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                raise errors.Unavailable(
                    f"hostkvd at {self._contact.target} does not listen yet") from None
        except ValueError:  # the channel closed under this call
            raise errors.FailedPrecondition("the client is closed") from None

    def _try(self, method, request):
        if self._channel is None:
            raise errors.FailedPrecondition("the client is closed")
        ring = self._ring
        if ring is not None and method in self._ring_methods:
            ring_method, response_type = self._ring_methods[method]
            try:
                answer = ring.call(ring_method, request.SerializeToString(), _CALL_TIMEOUT)
            except errors.Unavailable:
                # The daemon that served this ring is gone: calls wait for
                # it over gRPC, and a resumed session gets a new ring.
                if self._ring is ring:
                    self._ring = None
                raise
            if answer is not None:
                code, data = answer
                if code == 0:
                    return response_type.FromString(data)
                raise errors.from_code(code, data.decode("utf-8", "replace"))
        try:
            return method(request, timeout=_CALL_TIMEOUT, metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        except ValueError:  # the channel closed under this call
            raise errors.FailedPrecondition("the client is closed") from None

    @property
    def daemon_away(self):
        """True from a failed contact with hostkvd (a call found it
        unreachable, or the session socket hung up) until a call is answered."""
        return self._contact.away

    @property
    def session_lost(self):
        """The cause (str) if hostkvd no longer knows this session, else None."""
        return self._contact.lost

    def probe(self):
        """Asks hostkvd, without waiting, whether it holds this session:
        True (and daemon_away clears), False while it does not answer (down,
        restarting, or draining for a --takeover); SessionLost if it answers
        without the session."""
        try:
            self._call(self._stub.RenewSession,
                       pb.RenewSessionRequest(session_id=self.session_id), wait=False)
            return True
        except (errors.Unavailable, errors.Cancelled):
            return False

    @property
    def has_session_socket(self):
        """True on a unix: target (descriptors and pool mappings travel)."""
        return self._socket is not None

    # -- pools -----------------------------------------------------------

    def create_pool(self, spec, attach_if_exists=True, delete_with_session=False):
        """Creates a pool (hostkv_pb2.PoolSpec); returns the Pool.

        With attach_if_exists an existing pool of the same spec is returned
        instead of AlreadyExists. With delete_with_session a pool this call
        creates is deleted when the session ends (close, or this process's
        death), unless another session still holds pages or buffers in it.
        """
        return self._call(self._stub.CreatePool, pb.CreatePoolRequest(
            spec=spec, attach_if_exists=attach_if_exists, session_id=self.session_id,
            delete_with_session=delete_with_session))

    def map_pool(self, pool):
        """Maps pool `pool`'s segment into this process (a PoolMapping of
        its host pages, zero-copy), through a descriptor fetched over the
        session socket: read-write for the pool's owner uid (and root),
        read-only for other users the pool admits.

        PermissionDenied, NotFound; FailedPrecondition over TCP.
        """
        name = pool.encode("utf-8")
        if not name or len(name) >= _session_socket.CLIENT_NAME_BYTES:
            raise errors.InvalidArgument("a pool name of 1..64 characters")
        info = self.get_pool(pool)
        with self._lock:
            if self._socket is None:
                raise errors.FailedPrecondition(
                    "pool segments travel over the session socket: connect to a unix: target")
            reply = _session_socket.exchange(
                self._socket, _session_socket.message(
                    _session_socket.KIND_FETCH_POOL_SEGMENT, client_name=name))
        if reply.fd < 0:
            raise errors.Internal("the daemon's reply carried no descriptor")
        try:
            return pool_mapping.PoolMapping(reply.fd, info, writable=reply.value == 1)
        finally:
            os.close(reply.fd)

    def get_pool(self, name):
        """Returns the Pool; NotFound if none has this name."""
        return self._call(self._stub.GetPool, pb.GetPoolRequest(pool=name))

    def list_pools(self):
        return list(self._call(self._stub.ListPools, pb.ListPoolsRequest()).pools)

    def delete_pool(self, name):
        """FailedPrecondition while pages or imports use it; PermissionDenied."""
        self._call(self._stub.DeletePool,
                   pb.DeletePoolRequest(pool=name, session_id=self.session_id))

    # -- device buffers --------------------------------------------------

    def register_device_buffers(self, pool, token_slots, k, v=(), gpu_signals=None):
        """Registers per-layer device buffers k[l], v[l] (v empty for MLA).

        Entries are hostkv_pb2.DeviceBuffer (hostkv.shm.describe_passed,
        describe_shm, describe_cuda, hostkv.torch.device_buffers_for and
        hostkv.cuda.export_cuda make them); gpu_signals is a DeviceBuffer
        too (hostkv.cuda.GpuSignals.buffer). Returns the import id.
        """
        request = pb.RegisterDeviceBuffersRequest(
            session_id=self.session_id, pool=pool, token_slots=token_slots,
            k_buffers=list(k), v_buffers=list(v))
        if gpu_signals is not None:
            request.gpu_signals.CopyFrom(gpu_signals)
        import_id = self._call(self._stub.RegisterDeviceBuffers, request).import_id
        self._records.keep_import(import_id, request)
        return import_id

    def unregister_device_buffers(self, import_id):
        self._call(self._stub.UnregisterDeviceBuffers, pb.UnregisterDeviceBuffersRequest(
            session_id=self.session_id, import_id=import_id))
        self._records.forget_import(import_id)

    unregister = unregister_device_buffers

    def pass_descriptor(self, fd):
        """Hands the daemon `fd` (a memfd sealed against shrinking) over the
        session socket; returns the handle DeviceBuffer.passed_fd names it by.

        FailedPrecondition over TCP; InvalidArgument for an unsealed fd.
        """
        fd = fd if isinstance(fd, int) else fd.fileno()
        with self._lock:
            if self._socket is None:
                raise errors.FailedPrecondition(
                    "descriptors travel over the session socket: connect to a unix: target")
            reply = _session_socket.exchange(
                self._socket, _session_socket.message(_session_socket.KIND_PASS_FD), fd)
        if reply.fd >= 0:
            os.close(reply.fd)
        self._records.keep_passed(reply.value, fd)
        return reply.value

    def fetch_kv_word(self, import_id):
        """Fetches over the session socket the memfd of the "KV written" page
        of CUDA import `import_id` (registered with gpu_signals); the caller
        owns the returned descriptor. hostkv.cuda.GpuSignals.attach_kv_word
        does this for you.

        NotFound for an unknown import; FailedPrecondition for an import
        without gpu_signals or over TCP.
        """
        with self._lock:
            if self._socket is None:
                raise errors.FailedPrecondition(
                    "the KV-written page travels over the session socket: connect to a "
                    "unix: target")
            reply = _session_socket.exchange(self._socket, _session_socket.message(
                _session_socket.KIND_FETCH_KV_WORD, import_id=import_id))
        if reply.fd < 0:
            raise errors.Internal("the daemon's reply carried no descriptor")
        return reply.fd

    # -- host pages ------------------------------------------------------

    def alloc(self, pool, num_tokens, wait=True, fill_wait_ms=0,
              fill_no_wait=False):
        """Allocates num_tokens host slots (a multiple of the page size).

        Returns [(first_page, num_pages), ...]; ResourceExhausted when full.
        wait=False: Unavailable at once if hostkvd does not answer.
        While the pool is still being made resident (pool stats'
        fill_state): waits up to fill_wait_ms for its pages (0: the daemon's
        --pool_fill_wait), then DeadlineExceeded; fill_no_wait=True:
        FailedPrecondition at once.
        """
        response = self._call(self._stub.Alloc, pb.AllocRequest(
            session_id=self.session_id, pool=pool, num_tokens=num_tokens,
            fill_wait_ms=fill_wait_ms, fill_no_wait=fill_no_wait), wait)
        return [(r.first_page, r.num_pages) for r in response.pages]

    def free(self, pool, pages):
        """Frees pages (all or nothing); returns how many were freed."""
        return self._call(self._stub.Free, pb.FreeRequest(
            session_id=self.session_id, pool=pool,
            pages=_runs(pages, pb.PageRun))).pages_freed

    def hand_over_pages(self, pool, pages, to_session_number):
        """Gives pages to session `to_session_number`; returns how many moved."""
        return self._call(self._stub.HandOverPages, pb.HandOverPagesRequest(
            session_id=self.session_id, pool=pool, pages=_runs(pages, pb.PageRun),
            to_session_number=to_session_number)).pages

    # -- transfers -------------------------------------------------------

    def load(self, pool, import_id, host_pages, device_slots, **options):
        """Host pages -> device slots; returns the Operation once enqueued.

        Options: layer_begin, layer_end (0: every layer), mechanism,
        wait_kv_written, signal_value (0: the daemon picks; see
        TransferRequest.signal_value), gpu_waits_only (CUDA imports with GPU
        signals: no per-layer host progress; wait_layer then returns once
        the whole operation is done), progress_at_end (any import: the
        signal record moves once, when every layer is copied; for callers
        that wait for whole operations).
        """
        return self._transfer(self._stub.Load, pool, import_id, host_pages, device_slots,
                              **options)

    def backup(self, pool, import_id, host_pages, device_slots, **options):
        """Device slots -> host pages; returns the Operation once enqueued.

        Options as load's.
        """
        return self._transfer(self._stub.Backup, pool, import_id, host_pages, device_slots,
                              **options)

    def _transfer(self, method, pool, import_id, host_pages, device_slots, layer_begin=0,
                  layer_end=0, mechanism=pb.MECHANISM_UNSPECIFIED, wait_kv_written=0,
                  signal_value=0, gpu_waits_only=False, progress_at_end=False):
        request = pb.TransferRequest(
            session_id=self.session_id, pool=pool, import_id=import_id,
            host_page_pairs=_pairs(host_pages), device_slot_pairs=_pairs(device_slots),
            layer_begin=layer_begin, layer_end=layer_end, mechanism=mechanism,
            wait_kv_written=wait_kv_written, signal_value=signal_value,
            gpu_waits_only=gpu_waits_only, progress_at_end=progress_at_end)
        return self._submit("Load" if method == self._stub.Load else "Backup", request)

    def _submit(self, method_name, request):
        return self._call(getattr(self._stub, method_name), request,
                          on_answer=lambda response: self._issued(method_name, request,
                                                                  response))

    def _issued(self, method_name, request, response):
        """The Operation of a submission's answer, tracked until known
        finished. Runs inside the call's gate: the answering daemon is the
        one whose segment is current."""
        segment = self._records.segment_key(response.signal_segment_id)
        signals = self._records.segments.get(segment)
        if signals is None:
            raise errors.Internal(
                "the daemon answered with a signal segment this client was not given")
        if response.signal_index >= signals.slots:
            raise errors.Internal("the daemon returned a signal index out of range")
        op = Operation(response.op_id, response.signal_index, response.layer_begin,
                       response.num_layers, response.num_tokens, response.bytes,
                       response.signal_value, segment, request, method_name)
        self._records.track(op, self._ended)
        return op

    def _ended(self, op, layers=None):
        """Whether `op` is finished or abandoned in its own daemon's records
        (`layers` of it; all by default), without waiting."""
        signals = self._records.segments.get(op.segment)
        if signals is None:
            return False
        try:
            signals.wait_for_layers(op.signal_index, op.op_id,
                                    op.num_layers if layers is None else layers, 0)
            return True
        except errors.Aborted:
            return True
        except errors.HostKVError:
            return False

    def wait_layer(self, op, layer, timeout=60.0):
        """Blocks until layer `layer` (absolute) of `op` is copied, without
        calling the daemon (unless it went away meanwhile: then this waits
        for the next one and for what the resume submitted again for `op`).

        InvalidArgument if `op` does not cover the layer; Aborted if the
        daemon abandoned the operation; DeadlineExceeded after `timeout` s.
        """
        if layer < op.layer_begin or layer - op.layer_begin >= op.num_layers:
            raise errors.InvalidArgument(
                f"operation {op.op_id} covers layers [{op.layer_begin}, "
                f"{op.layer_begin + op.num_layers}), not {layer}")
        deadline = time.monotonic() + timeout
        while True:
            op = self._current(op)
            layers = layer - op.layer_begin + 1
            signals = self._records.segments.get(op.segment)
            if op.segment != self._records.segment:
                # Of an earlier daemon, and no resume submitted it again:
                # it had finished there (or had not been tracked).
                if signals is not None and self._ended(op, layers):
                    signals.wait_for_layers(op.signal_index, op.op_id, layers, 0)
                    return
                with self._resume_lock:
                    pass  # a resume under way decides its fate first
                if self._records.replacement(op) is None:
                    self._records.replace(op, self._submit(op.method, op.request))
                continue
            left = deadline - time.monotonic()
            try:
                # In slices: a daemon that died mid-operation never completes
                # it; the session socket's hang-up says so.
                signals.wait_for_layers(op.signal_index, op.op_id, layers, min(left, 0.2))
                return
            except errors.DeadlineExceeded:
                if time.monotonic() >= deadline:
                    raise
                if op.segment == self._records.segment and not self._hung_up():
                    continue
                # The daemon went away: a call waits for the next one and
                # resumes the session (which submits `op` again).
                self._call(self._stub.RenewSession,
                           pb.RenewSessionRequest(session_id=self.session_id))

    def _current(self, op):
        """`op`, or what a resume submitted again for it (raising what that
        submission raised)."""
        while True:
            replacement = self._records.replacement(op)
            if replacement is None:
                return op
            if isinstance(replacement, errors.HostKVError):
                raise errors.from_code(
                    replacement.code,
                    f"operation {op.op_id}, submitted again after hostkvd restarted: "
                    f"{replacement.message}")
            op = replacement

    def _hung_up(self):
        with self._lock:
            sock = self._socket
        if sock is None:
            return False
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLRDHUP)
        return any(ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR)
                   for _, ev in poller.poll(0))

    def _resume_session(self):
        """Resumes the session with a daemon that adopted its predecessor's
        state: a new session socket and signal records, the descriptors
        passed and the imports registered again with their ids, and the
        loads and backups the previous daemon had not finished submitted
        again, before any other call of this client reaches the daemon.
        NotFound if the daemon does not have the session."""
        seen = self._records.generation
        with self._resume_lock:
            if self._records.generation != seen:
                return  # another thread did
            with self._gate.resume():
                self._resume_with_gate_held(seen)

    def _resume_with_gate_held(self, seen):
        sock = _session_socket.connect(self._socket_path)
        try:
            reply = _session_socket.exchange(sock, _session_socket.message(
                _session_socket.KIND_RESUME, client_name=self._client_name_bytes,
                session_id=self.session_id))
            if reply.fd < 0:
                raise errors.Internal("the daemon sent no signal segment")
            try:
                signals = _signals.SignalSegment(reply.fd, reply.signal_slots)
            finally:
                os.close(reply.fd)
            passed = self._records.passed()
            for handle, fd in passed.items():
                _session_socket.exchange(sock, _session_socket.message(
                    _session_socket.KIND_PASS_FD, import_id=handle), fd)
        except BaseException:
            sock.close()
            raise
        ring = self._open_ring(sock, reply.features)
        self._route_ring_extras(reply.features)
        with self._lock:
            old, self._socket = self._socket, sock
        old_ring, self._ring = self._ring, ring
        if old_ring is not None:
            old_ring.close()
        self._signals = signals
        self._records.use_segment(reply.value or ("g", seen + 1), signals)
        if old is not None:
            old.close()
        imports = self._records.imports()
        for import_id, request in imports.items():
            request.import_id = import_id
            self._call_once(self._stub.RegisterDeviceBuffers, request)
        references, _ = self._take_references_again()
        again = self._submit_unfinished()
        self._records.generation += 1
        with self._lock:
            rearm = bool(self._on_lost) and self._watcher is not None
        if rearm:
            self._stop_watching()
            with self._lock:
                self._watch_wake = os.pipe2(os.O_CLOEXEC)
                self._watcher = threading.Thread(
                    target=self._watch, args=(sock.fileno(), self._watch_wake[0]),
                    name="hostkv-watch", daemon=True)
                self._watcher.start()
        logging.getLogger("hostkv").warning(
            "hostkv: session %d resumed with hostkvd at %s after its restart: "
            "%d descriptors passed and %d imports registered again, %d references "
            "on cached pages taken again, %d unfinished loads/backups submitted again",
            self.session_number, self._contact.target, len(passed), len(imports),
            references, again)

    def _submit_unfinished(self):
        """Submits again each tracked operation its daemon had not finished;
        returns how many. A refusal is kept as the operation's fate (its
        wait raises it); the daemon going away again leaves the rest for
        the next resume."""
        pending = [op for op in self._records.take_outstanding()
                   if op.segment != self._records.segment and not self._ended(op)]
        for i, op in enumerate(pending):
            try:
                replacement = self._call_once(
                    getattr(self._stub, op.method), op.request,
                    on_answer=lambda r, op=op: self._issued(op.method, op.request, r))
            except (errors.Unavailable, errors.Cancelled):
                for left in pending[i:]:
                    self._records.track(left, self._ended)
                raise
            except errors.HostKVError as e:
                replacement = e
            self._records.replace(op, replacement)
        return len(pending)

    def wait(self, op, timeout=60.0):
        """Blocks until every layer of `op` is copied."""
        if op.num_layers == 0:
            return
        self.wait_layer(op, op.layer_begin + op.num_layers - 1, timeout)

    # -- page access and stats ---------------------------------------------

    def read_pages(self, pool, pages):
        """Pages in SGLang's flat page format, concatenated (bytes)."""
        return self._call(self._stub.ReadPages, pb.ReadPagesRequest(
            session_id=self.session_id, pool=pool, pages=_runs(pages, pb.PageRun))).data

    def write_pages(self, pool, pages, data):
        self._call(self._stub.WritePages, pb.WritePagesRequest(
            session_id=self.session_id, pool=pool, pages=_runs(pages, pb.PageRun),
            data=bytes(data)))

    def get_page_buffer_meta(self, pool, pages):
        """GetPageBufferMetaResponse: segment_name and the pieces' offsets."""
        return self._call(self._stub.GetPageBufferMeta, pb.GetPageBufferMetaRequest(
            pool=pool, pages=_runs(pages, pb.PageRun)))

    def get_pool_stats(self, pool=""):
        """GetPoolStatsResponse of one pool, or of every pool when empty."""
        return self._call(self._stub.GetPoolStats, pb.GetPoolStatsRequest(pool=pool))


def count_tokens(pages, page_size):
    """Tokens covered by `pages` in a pool of `page_size`."""
    return sum(n for _, n in pages) * page_size
