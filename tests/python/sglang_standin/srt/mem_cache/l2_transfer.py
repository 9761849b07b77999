"""The L2 (device <-> host) transfer engines of
python/sglang/srt/mem_cache/l2_transfer.py, in two versions:

- L2TransferEngine: the file at 67e863cd83d8249061e7f9a67472a61e4b359559,
  which managers/cache_controller.py @001067ff builds and calls with
  layer_num=. A write is one backup_from_device_all_layer(device_pool,
  host_indices, device_indices, io_backend) per transfer; a load is, per
  layer, load_to_device_per_layer(device_pool, host_indices,
  device_indices, layer_id, io_backend, is_draft=...) per transfer and then
  on_layer_done(layer_id).
- L2TransferEnginePhysical: the file at
  086fe1aa9c2904630c17e0fb58f6202633455609 (transfer_layer_id_max=). Each
  submission first asks every transfer's host pool, once,
  prepare_transfer_indices(host_indices, device_indices, io_backend) ->
  (host_indices, device_indices) and then moves with the *_physical calls
  on those indices.

Both record, on their own streams (device_to_host / host_to_device), an
ack start event and an ack finish event around the work, after making the
stream wait for the start event (the caller's, or one recorded on the
current stream). Streams and events come from the device module; here the
CPU one (srt/cpu_device.py: work is done when the call returns, events
are complete at once, streams and events keep bookkeeping for tests).
Transfers after the first (the "primary") with no layer_mapper are
skipped for layers at or past their host pool's layer_num.
"""
import contextlib
import functools
import logging
from typing import Any, Callable, NamedTuple, Optional

from ..utils import get_device_module
from .pool_host.base import shared_host_layout_domains

logger = logging.getLogger(__name__)
device_module = get_device_module()


@functools.lru_cache(maxsize=None)
def _timing_events_supported():
    try:
        device_module.Event(enable_timing=True)
    except (TypeError, NotImplementedError):
        logger.warning("%s.Event has no timing; L2 transfer timing is off",
                       device_module.__name__)
        return False
    return True


def make_timing_event_pair():
    """(start event, finish event, whether they time)."""
    timing = _timing_events_supported()
    options = {"enable_timing": True} if timing else {}
    return device_module.Event(**options), device_module.Event(**options), timing


class L2Transfer(NamedTuple):
    host_pool: Any
    device_pool: Any
    host_indices: Any
    device_indices: Any
    layer_mapper: Optional[Callable[[int], Optional[int]]] = None
    is_draft: bool = False


class TransferCompletion(NamedTuple):
    start_event: Any
    finish_event: Any
    timing_enabled: bool


def _layer_of(transfer, layer_id, primary):
    """The host pool's layer for the engine's layer_id, or None to skip."""
    if transfer.layer_mapper is not None:
        return transfer.layer_mapper(layer_id)
    if transfer is not primary and layer_id >= transfer.host_pool.layer_num:
        return None
    return layer_id


class _EngineBase:
    """Runs resolved transfers; owns no cache state."""

    def __init__(self, io_backend: str):
        self.io_backend = io_backend
        self.device_to_host_stream = device_module.Stream()
        self.host_to_device_stream = device_module.Stream()

    @staticmethod
    def _start_event(start_event):
        if start_event is not None:
            return start_event
        event = device_module.Event()
        event.record()  # on the caller's current stream
        return event

    @staticmethod
    def _record_stream(transfers, stream, resolved=()):
        tensors = [t for tr in transfers for t in (tr.host_indices, tr.device_indices)]
        for tensor in tensors + list(resolved):
            if tensor is not None and tensor.is_cuda:
                tensor.record_stream(stream)

    def _per_layer(self, transfers, layers, load, on_layer_done):
        primary = transfers[0] if transfers else None
        for layer_id in range(layers):
            for transfer in transfers:
                local = _layer_of(transfer, layer_id, primary)
                if local is not None:
                    load(transfer, local)
            if on_layer_done is not None:
                on_layer_done(layer_id)


class L2TransferEngine(_EngineBase):
    """l2_transfer.py @67e863cd (see the module)."""

    def submit_device_to_host(self, transfers):
        start_event = self._start_event(None)
        ack_start, ack_finish, timing = make_timing_event_pair()
        stream = self.device_to_host_stream
        with device_module.stream(stream):
            start_event.wait(stream)
            ack_start.record()
            for t in transfers:
                t.host_pool.backup_from_device_all_layer(t.device_pool, t.host_indices,
                                                         t.device_indices, self.io_backend)
            ack_finish.record()
            self._record_stream(transfers, stream)
        return TransferCompletion(ack_start, ack_finish, timing)

    def submit_host_to_device(self, transfers, *, layer_num: int, start_event=None,
                              on_layer_done=None):
        start_event = self._start_event(start_event)
        ack_start, ack_finish, timing = make_timing_event_pair()
        stream = self.host_to_device_stream

        def load(t, layer):
            t.host_pool.load_to_device_per_layer(t.device_pool, t.host_indices,
                                                 t.device_indices, layer, self.io_backend,
                                                 is_draft=t.is_draft)

        with device_module.stream(stream):
            start_event.wait(stream)
            ack_start.record()
            self._per_layer(transfers, layer_num, load, on_layer_done)
            ack_finish.record()
            self._record_stream(transfers, stream)
        return TransferCompletion(ack_start, ack_finish, timing)


class L2TransferEnginePhysical(_EngineBase):
    """l2_transfer.py @086fe1aa (see the module)."""

    @staticmethod
    def _resolve_device_indices(transfer):
        """Device ids through the device pool's host_transfer_translate, if
        it has one (compacting pools); as given otherwise."""
        translate = getattr(transfer.device_pool, "host_transfer_translate", None)
        if translate is None:
            return transfer.device_indices
        where = transfer.device_indices.device
        ids = transfer.device_indices.to(getattr(transfer.device_pool, "device", where))
        ids = ids.contiguous()
        dcp = getattr(transfer.host_pool, "dcp_size", 1)
        if dcp > 1:
            resolved = translate(ids // dcp) * dcp + ids % dcp
        else:
            resolved = translate(ids)
        return resolved.to(where)

    def _prepare_transfers(self, transfers):
        prepared = []
        for t in transfers:
            host, dev = t.host_pool.prepare_transfer_indices(
                t.host_indices, self._resolve_device_indices(t), self.io_backend)
            prepared.append(t._replace(host_indices=host, device_indices=dev))
        return prepared

    @contextlib.contextmanager
    def _submission(self, transfers, stream, transfer_key, start_event=None):
        start_event = self._start_event(start_event)
        ack_start, ack_finish, timing = make_timing_event_pair()
        completion = TransferCompletion(ack_start, ack_finish, timing)
        domains = shared_host_layout_domains(t.host_pool for t in transfers)
        for domain in domains:
            domain.acquire_layout()
        finished = False
        try:
            with device_module.stream(stream):
                start_event.wait(stream)
                prepared = self._prepare_transfers(transfers)  # before ack_start
                ack_start.record()
                yield prepared, completion
                ack_finish.record()
                finished = True
                self._record_stream(transfers + prepared, stream)
        except Exception:
            stream.synchronize()
            raise
        finally:
            for domain in reversed(domains):
                domain.release_layout(ack_finish if finished else None,
                                      (id(self), transfer_key))

    def submit_device_to_host(self, transfers):
        with self._submission(transfers, self.device_to_host_stream,
                              "device_to_host") as (prepared, completion):
            for t in prepared:
                t.host_pool.backup_from_device_all_layer_physical(
                    t.device_pool, t.host_indices, t.device_indices, self.io_backend)
        return completion

    def submit_host_to_device(self, transfers, *, transfer_layer_id_max: int,
                              start_event=None, on_layer_done=None):
        def load(t, layer):
            t.host_pool.load_to_device_per_layer_physical(
                t.device_pool, t.host_indices, t.device_indices, layer, self.io_backend,
                is_draft=t.is_draft)

        with self._submission(transfers, self.host_to_device_stream, "host_to_device",
                              start_event) as (prepared, completion):
            self._per_layer(prepared, transfer_layer_id_max, load, on_layer_done)
        return completion
