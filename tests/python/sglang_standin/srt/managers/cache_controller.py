"""HiCacheController, modelled on python/sglang/srt/managers/cache_controller.py
at 001067fffe33427bee0ed2f007fb7551a1d76b44 (read in full), with the same
constructor, the same calls on the host pool, the device pool, the device
allocator, the L2 transfer engine and the storage backend, in the same
order and with the same arguments:

- write(device_indices) -> mem_pool_host.alloc(n), then start_writing():
  merge the queued ops, move the indices for the io_backend (kernel: host
  indices to the device; direct: layer_first sorts host indices and
  reorders device ones, page_first_direct moves device indices to the
  CPU; kernel + page_first + can_use_write_back_jit keeps them), one
  engine submit_device_to_host, a HiCacheAck on ack_write_queue.
- load(host_indices) -> the device allocator's alloc(n), queued;
  start_loading(): the LayerDoneCounter's next producer slot (a ring of
  3), merge, move, the slot's start event recorded, one engine
  submit_host_to_device with on_layer_done = the slot's complete, and
  layer_num= (the 67e863cd engine) -- or transfer_layer_id_max= in
  HiCacheControllerTransferLayerIdMax, the controller that goes with the
  086fe1aa engine (that controller was not stored; the keyword and the
  attribute name are from the engine and from test stand-ins seen).
- evict_device / evict_host; attach_storage_backend (the storage config,
  StorageBackendFactory.create_backend(name, config, host pool),
  register_mem_pool_host, zero-copy v1 calls for the listed backends and
  for "dynamic" with extra_config["interface_v1"], the four storage
  threads); the hit query (batch_exists per STORAGE_BATCH_SIZE pages), the
  page transfer (batch_get_v1, or get_dummy_flat_data_page + batch_get +
  set_from_flat_data_page), the backup (batch_set_v1, or get_data_page +
  batch_set), PrefetchAck per batch, the MIN all-reduces over the sync
  groups (none with one rank).

Stand-in additions (not SGLang's): storage_thread_errors collects what
kills a storage thread (SGLang's threads catch only queue.Empty and die
silently; the thread dies here too, but a test can say why).
"""
import logging
import threading
import time
from dataclasses import dataclass
from queue import Empty, Queue
from typing import List, NamedTuple, Optional

import torch

from ..layers.dp_attention import (get_attention_dp_rank, get_attention_dp_size,
                                   is_dp_attention_enabled)
from ..mem_cache.hicache_storage import (STORAGE_BATCH_SIZE, HiCacheStorageConfig,
                                         HiCacheStorageExtraInfo, PoolName, PoolTransfer,
                                         count_pool_hits)
from ..mem_cache.l2_transfer import L2Transfer, L2TransferEngine, L2TransferEnginePhysical
from ..mem_cache.memory_pool import MLATokenToKVPool
from ..runtime_context import get_parallel
from ..utils import get_device_module

logger = logging.getLogger(__name__)
device_module = get_device_module()
_RATE_LIMIT_LOG_INTERVAL_S = 30.0
HICACHE_LOAD_POOL_USAGE_FRACTION = 0.9
HICACHE_WRITE_STAGING_POOL_FRACTION = 0.2
_ROUTER_HINT_EXTRA_INFO_KEY = "kvcc_router_hint"
_ZERO_COPY_BACKENDS = ("hf3fs", "mooncake", "eic", "nixl", "simm", "mori", "kvcc")


class LayerLoadingEvent:
    """One load's per-layer events; finish_event is the last layer's."""

    def __init__(self, num_layers: int):
        self._num_layers = num_layers
        self.load_events = [device_module.Event() for _ in range(num_layers)]
        self.start_event = device_module.Event()

    def complete(self, layer_index: int):
        assert 0 <= layer_index < self._num_layers
        self.load_events[layer_index].record()  # on the current (the engine's) stream

    def wait(self, layer_index: int):
        device_module.current_stream().wait_event(self.load_events[layer_index])

    @property
    def finish_event(self):
        return self.load_events[-1]


class LayerDoneCounter:
    """A ring of 3 LayerLoadingEvents: the producer (a load) takes the next
    slot, a consumer (a forward pass) waits on its slot's layer events."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self.num_counters = 3
        self.events = [LayerLoadingEvent(num_layers) for _ in range(self.num_counters)]
        self.producer_index = -1
        self.consumer_index = -1

    def update_producer(self):
        self.producer_index = (self.producer_index + 1) % self.num_counters
        assert self.events[self.producer_index].finish_event.query(), (
            "Producer finish event should be ready before being reused.")
        return self.producer_index

    def set_consumer(self, index: int):
        self.consumer_index = index

    def wait_until(self, threshold: int):
        if self.consumer_index >= 0:
            self.events[self.consumer_index].wait(threshold)

    def reset(self):
        self.producer_index = -1
        self.consumer_index = -1


class CacheOperation:
    counter = 0

    def __init__(self, host_indices, device_indices, node_id: int,
                 priority: Optional[int] = None, pool_transfers=None):
        self.host_indices = host_indices
        self.device_indices = device_indices
        self.node_ids = [node_id]
        self.data = None
        self.pool_transfers = pool_transfers
        self.id = CacheOperation.counter
        CacheOperation.counter += 1
        self.priority = self.id if priority is None else priority

    @staticmethod
    def _merge_pool_transfers(ops):
        groups = {}
        for op in ops:
            for t in op.pool_transfers or []:
                groups.setdefault((t.name, t.indices_from_pool), []).append(t)
        if not groups:
            return None

        def cat(tensors):
            present = [t for t in tensors if t is not None]
            return torch.cat(present) if present else None

        return [PoolTransfer(name=ts[0].name,
                             host_indices=cat(t.host_indices for t in ts),
                             device_indices=cat(t.device_indices for t in ts),
                             keys=[k for t in ts if t.keys for k in t.keys] or None,
                             hit_policy=ts[0].hit_policy,
                             indices_from_pool=ts[0].indices_from_pool)
                for ts in groups.values()]

    @staticmethod
    def merge_ops(ops):
        """One op for all `ops` (the op itself when there is one)."""
        assert ops
        if len(ops) == 1:
            return ops[0]
        merged = CacheOperation(torch.cat([op.host_indices for op in ops]),
                                torch.cat([op.device_indices for op in ops]), -1,
                                min(op.priority for op in ops),
                                pool_transfers=CacheOperation._merge_pool_transfers(ops))
        merged.node_ids = [node for op in ops for node in op.node_ids]
        return merged

    def __lt__(self, other):
        return self.priority < other.priority


class HiCacheAck(NamedTuple):
    start_event: object
    finish_event: object
    node_ids: List[int]
    num_tokens: int = 0
    timing_enabled: bool = False
    num_tokens_by_pool: Optional[dict] = None
    num_bytes: int = 0


@dataclass
class PrefetchAck:
    """Progress of a prefetch: completed_tokens per batch, then one with
    completed_req=True (the last for the request)."""
    rid: str
    operation: object
    completed_tokens: Optional[int] = None
    pool_hits: Optional[dict] = None
    completed_req: Optional[bool] = None


def _router_hint_extra_info(operation):
    if operation.router_hint is None:
        return None
    return {_ROUTER_HINT_EXTRA_INFO_KEY: operation.router_hint}


class StorageOperation:
    counter = 0

    def __init__(self, host_indices, token_ids, last_hash=None, hash_value=None,
                 prefix_keys=None, router_hint=None):
        self.host_indices = host_indices
        self.token_ids = token_ids
        self.last_hash = last_hash
        self.completed_tokens = 0
        self.hash_value = [] if hash_value is None else hash_value
        self.prefix_keys = prefix_keys
        self.all_hash_values = None
        self.stats_requested_tokens = 0
        self.stats_total_tokens = 0
        self.router_hint = router_hint
        self.id = StorageOperation.counter
        StorageOperation.counter += 1

    def __lt__(self, other):
        return self.id < other.id


class PrefetchOperation(StorageOperation):
    def __init__(self, request_id, token_ids, last_hash=None, prefix_keys=None,
                 router_hint=None):
        self.request_id = request_id
        self._lock = threading.Lock()
        self._terminated_flag = False
        self.storage_hit_count = 0
        self.start_time = time.monotonic()
        super().__init__(None, token_ids, last_hash, prefix_keys=prefix_keys,
                         router_hint=router_hint)

    def mark_terminate(self):
        with self._lock:
            self._terminated_flag = True

    def is_terminated(self):
        with self._lock:
            return self._terminated_flag


class HiCacheController:
    """cache_controller.py @001067ff, with the 67e863cd L2 engine."""

    l2_engine_class = L2TransferEngine
    uses_transfer_layer_id_max = False

    def __init__(self, token_to_kv_pool_allocator, mem_pool_host, page_size: int, tp_group,
                 load_cache_event: threading.Event, attn_cp_group=None, attn_tp_group=None,
                 pp_group=None, write_policy: str = "write_through_selective",
                 io_backend: str = "", storage_backend: Optional[str] = None,
                 prefetch_threshold: int = 256, model_name: Optional[str] = None,
                 storage_backend_extra_config: Optional[dict] = None,
                 enable_storage_metrics: bool = False, host_memory_mode: str = "cache"):
        # load_cache_event is taken and not kept, as in SGLang.
        self.tp_group = tp_group
        self.host_memory_mode = host_memory_mode
        self.attn_cp_group = attn_cp_group
        self.attn_tp_group = attn_tp_group
        self.pp_group = pp_group
        self.prefetch_hits_sync_groups = []
        self.prefetch_completion_sync_groups = []
        self.mem_pool_device_allocator = token_to_kv_pool_allocator
        device_pool = token_to_kv_pool_allocator.get_kvcache()
        # pylint: disable-next=import-outside-toplevel
        from ..mem_cache.memory_pool import HybridLinearKVPool
        if isinstance(device_pool, HybridLinearKVPool):
            device_pool = device_pool.full_kv_pool
        self.mem_pool_device = device_pool
        self.mem_pool_host = mem_pool_host
        self.storage_host_pool = mem_pool_host
        self.write_policy = write_policy
        self.page_size = page_size
        self.io_backend = io_backend
        self.enable_storage = False
        self.storage_backend = None
        self.storage_backend_type = None
        self.enable_storage_metrics = enable_storage_metrics
        self.host_write_staged_tokens_fn = None
        self.page_get_func = self._generic_page_get
        self.page_set_func = self._generic_page_set
        self.storage_stop_event = threading.Event()
        self.storage_thread_errors = []  # stand-in only (see the module)
        self.prefetch_buffer = None
        self.prefetch_sync_queue = None
        self.prefetch_hit_queue = None
        self.ack_prefetch_queue = Queue()
        self.ack_backup_queue = None
        self.host_mem_release_queue = None

        self.device = self.mem_pool_device.device
        self.layer_num = self.mem_pool_device.layer_num
        self.layer_done_counter = LayerDoneCounter(self.layer_num)
        self.mem_pool_device.register_layer_transfer_counter(self.layer_done_counter)

        if write_policy not in ("write_through", "write_through_selective", "write_back"):
            raise ValueError(f"Invalid write policy: {write_policy}")
        self.load_queue = []
        self.write_queue = []
        self.ack_load_queue = []
        self.ack_write_queue = []

        self.transfer_layer_id_max = self.layer_num if self.uses_transfer_layer_id_max else None
        self.l2_transfer_engine = self.l2_engine_class(io_backend)

        if storage_backend is not None:
            try:
                self.attach_storage_backend(
                    storage_backend=storage_backend, prefetch_threshold=prefetch_threshold,
                    model_name=model_name,
                    storage_backend_extra_config=storage_backend_extra_config)
            except ValueError as e:
                raise ValueError(f"Failed to create storage backend: {e}") from e

    # -- parallel groups ---------------------------------------------------------

    def get_attn_cp_rank_and_size(self):
        if self.attn_cp_group is None:
            return 0, 1
        return (torch.distributed.get_rank(group=self.attn_cp_group),
                torch.distributed.get_world_size(group=self.attn_cp_group))

    def _create_sync_groups(self):
        # pylint: disable-next=import-outside-toplevel
        from ..distributed.parallel_state import create_custom_parallel_group
        if self.attn_cp_group is not None or self.attn_tp_group is not None:
            candidates = [self.attn_cp_group, self.attn_tp_group]
        else:
            candidates = [self.tp_group]
        if self.pp_group is not None:
            candidates.append(self.pp_group)
        groups, seen = [], set()
        for group in candidates:
            if group is None or torch.distributed.get_world_size(group=group) == 1:
                continue
            ranks = tuple(torch.distributed.get_process_group_ranks(group))
            if ranks in seen:
                continue
            seen.add(ranks)
            groups.append(create_custom_parallel_group(group_ranks=list(ranks), backend="gloo"))
        return groups

    @staticmethod
    def _destroy_sync_groups(groups):
        for group in groups:
            try:
                torch.distributed.destroy_process_group(group)
            except Exception:  # pylint: disable=broad-except
                pass

    @staticmethod
    def _all_reduce(tensor, op, groups):
        for group in groups:
            torch.distributed.all_reduce(tensor, op=op, group=group)

    # -- storage threads -------------------------------------------------------------

    def _thread(self, target):
        def run():
            try:
                target()
            except BaseException as e:  # stand-in only: keep what killed it
                self.storage_thread_errors.append((target.__name__, e))
                raise
        return threading.Thread(target=run, name=target.__name__, daemon=True)

    def _start_storage_threads(self):
        assert self.enable_storage
        assert not self.storage_stop_event.is_set()
        self.prefetch_thread = self._thread(self.prefetch_thread_func)
        self.prefetch_io_aux_thread = self._thread(self.prefetch_io_aux_func)
        self.prefetch_sync_thread = self._thread(self.prefetch_sync_thread_func)
        self.backup_thread = self._thread(self.backup_thread_func)
        self.prefetch_queue = Queue()
        self.backup_queue = Queue()
        self.prefetch_buffer = Queue()
        self.prefetch_sync_queue = Queue()
        self.prefetch_hit_queue = Queue()
        self.ack_prefetch_queue = Queue()
        self.ack_backup_queue = Queue()
        self.host_mem_release_queue = Queue()
        for t in (self.prefetch_thread, self.prefetch_io_aux_thread, self.prefetch_sync_thread,
                  self.backup_thread):
            t.start()

    def _stop_storage_threads(self):
        self.storage_stop_event.set()
        for name in ("prefetch_queue", "backup_queue", "prefetch_buffer", "prefetch_sync_queue"):
            queue = getattr(self, name, None)
            if queue is not None:
                queue.put_nowait(None)
        threads = [getattr(self, n) for n in ("prefetch_thread", "backup_thread",
                                               "prefetch_io_aux_thread", "prefetch_sync_thread")
                   if hasattr(self, n)]
        for t in threads:
            t.join(timeout=10)
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            logger.error("Failed to stop HiCache storage threads cleanly: %s", alive)
            raise RuntimeError("Failed to stop HiCache storage threads cleanly.")

    # -- attach / detach -------------------------------------------------------------

    def attach_storage_backend(self, storage_backend: str, prefetch_threshold: int = 256,
                               model_name: Optional[str] = None,
                               storage_backend_extra_config: Optional[dict] = None):
        if self.enable_storage:
            raise RuntimeError("Storage backend already attached.")
        try:
            self._stop_storage_threads()
        except Exception as e:
            raise RuntimeError("Cannot attach storage backend: previous detach did not stop "
                               "storage threads cleanly.") from e
        self.storage_backend_type = storage_backend
        from ..mem_cache.utils import get_hash_str  # pylint: disable=import-outside-toplevel
        self.get_hash_str = get_hash_str
        self.storage_config = self._generate_storage_config(model_name,
                                                            storage_backend_extra_config)
        # MLA: only TP rank 0 writes (every rank holds the same latent).
        self.backup_skip = self.storage_config.is_mla_model and self.storage_config.tp_rank != 0
        # pylint: disable-next=import-outside-toplevel
        from ..mem_cache.storage import StorageBackendFactory
        try:
            self.storage_backend = StorageBackendFactory.create_backend(
                storage_backend, self.storage_config, self.storage_host_pool)
            self.storage_backend.register_mem_pool_host(self.storage_host_pool)
            self.enable_storage = True
            self.prefetch_threshold = max(prefetch_threshold, self.page_size)
            fraction = (HICACHE_LOAD_POOL_USAGE_FRACTION
                        if self.host_memory_mode == "buffer_only" else 0.5)
            self.prefetch_capacity_limit = int(fraction * self.mem_pool_host.size)
            self.prefetch_tokens_occupied = 0
            self._last_rate_limit_log_s = 0.0
            self.prefetch_hits_sync_groups = self._create_sync_groups()
            self.prefetch_completion_sync_groups = self._create_sync_groups()
            self.page_get_func = self._generic_page_get
            self.page_set_func = self._generic_page_set
            zero_copy = self.storage_backend_type in _ZERO_COPY_BACKENDS or (
                self.storage_backend_type == "dynamic"
                and bool(self.storage_config.extra_config.get("interface_v1", 0)))
            if zero_copy:
                self.page_get_func = self._page_get_zero_copy
                self.page_set_func = self._page_set_zero_copy
            self.storage_stop_event.clear()
            self._start_storage_threads()
        except Exception:
            try:
                self._stop_storage_threads()
            except Exception:  # pylint: disable=broad-except
                pass
            self._destroy_sync_groups(self.prefetch_hits_sync_groups)
            self._destroy_sync_groups(self.prefetch_completion_sync_groups)
            self.prefetch_hits_sync_groups = []
            self.prefetch_completion_sync_groups = []
            try:
                if self.storage_backend is not None and hasattr(self.storage_backend, "close"):
                    self.storage_backend.close()
            except Exception:  # pylint: disable=broad-except
                pass
            self.storage_backend = None
            self.storage_backend_type = None
            self.enable_storage = False
            self.page_get_func = self._generic_page_get
            self.page_set_func = self._generic_page_set
            raise

    def detach_storage_backend(self):
        try:
            self._stop_storage_threads()
        except Exception as e:
            logger.exception("Stop storage threads failed: %s", e)
            raise RuntimeError("Stop storage threads failed; detach aborted.") from e
        self._destroy_sync_groups(self.prefetch_hits_sync_groups
                                  + self.prefetch_completion_sync_groups)
        self.prefetch_hits_sync_groups = []
        self.prefetch_completion_sync_groups = []
        try:
            if self.storage_backend is not None and hasattr(self.storage_backend, "close"):
                self.storage_backend.close()
        except Exception:  # pylint: disable=broad-except
            logger.exception("Failed to close storage backend cleanly.")
        self.storage_backend = None
        self.storage_backend_type = None
        self.enable_storage = False
        self.page_get_func = self._generic_page_get
        self.page_set_func = self._generic_page_set
        self.storage_stop_event.clear()

    def _generate_storage_config(self, model_name=None, storage_backend_extra_config=None):
        extra = {} if storage_backend_extra_config is None else storage_backend_extra_config
        parallel = get_parallel()
        if is_dp_attention_enabled():
            self.tp_rank, self.tp_size = parallel.attn_tp_rank, parallel.attn_tp_size
            self.dp_rank, self.dp_size = get_attention_dp_rank(), get_attention_dp_size()
        else:
            self.tp_rank, self.tp_size = parallel.tp_rank, parallel.tp_size
            self.dp_rank, self.dp_size = 0, 1
        self.pp_rank, self.pp_size = parallel.pp_rank, parallel.pp_size
        # pylint: disable-next=import-outside-toplevel
        from ..mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool
        replicated = isinstance(self.mem_pool_device, (MLATokenToKVPool, DeepSeekV4TokenToKVPool))
        tp_lcm_size = extra.pop("tp_lcm_size", None)
        should_split_heads = False
        if tp_lcm_size:
            assert tp_lcm_size % self.tp_size == 0, "tp_lcm_size must be divisible by tp_size."
            should_split_heads = (not replicated and self.mem_pool_host.layout == "page_head"
                                  and tp_lcm_size > self.tp_size)
        cp_rank, cp_size = self.get_attn_cp_rank_and_size()
        return HiCacheStorageConfig(
            tp_rank=self.tp_rank, tp_size=self.tp_size, pp_rank=self.pp_rank,
            pp_size=self.pp_size, attn_cp_rank=cp_rank, attn_cp_size=cp_size,
            is_mla_model=replicated, enable_storage_metrics=self.enable_storage_metrics,
            is_page_first_layout=self.mem_pool_host.layout == "page_first",
            model_name=model_name, dp_rank=self.dp_rank, dp_size=self.dp_size,
            tp_lcm_size=tp_lcm_size, should_split_heads=should_split_heads,
            extra_config=extra)

    def reset(self):
        self.storage_stop_event.set()
        self.write_queue.clear()
        self.load_queue.clear()
        self.ack_write_queue.clear()
        self.ack_load_queue.clear()
        if self.enable_storage:
            for t in (self.prefetch_thread, self.prefetch_io_aux_thread,
                      self.prefetch_sync_thread, self.backup_thread):
                t.join()
            for q in (self.prefetch_queue, self.backup_queue, self.prefetch_buffer,
                      self.prefetch_sync_queue, self.prefetch_hit_queue,
                      self.ack_prefetch_queue, self.ack_backup_queue,
                      self.host_mem_release_queue):
                q.queue.clear()
            self.prefetch_tokens_occupied = 0
        self.storage_stop_event.clear()
        if self.enable_storage:
            self.prefetch_thread = self._thread(self.prefetch_thread_func)
            self.prefetch_io_aux_thread = self._thread(self.prefetch_io_aux_func)
            self.prefetch_sync_thread = self._thread(self.prefetch_sync_thread_func)
            self.backup_thread = self._thread(self.backup_thread_func)
            for t in (self.prefetch_thread, self.prefetch_io_aux_thread,
                      self.prefetch_sync_thread, self.backup_thread):
                t.start()

    # -- device -> host ------------------------------------------------------------

    def write(self, device_indices, priority=None, node_id=-1):
        """Backs device_indices up to new host pages; their host indices, or
        None when the host pool has too few free."""
        host_indices = self.mem_pool_host.alloc(len(device_indices))
        if host_indices is None:
            return None
        self.write_queue.append(CacheOperation(host_indices, device_indices, node_id, priority))
        self.start_writing()
        return host_indices

    def start_writing(self):
        if not self.write_queue:
            return
        op = CacheOperation.merge_ops(self.write_queue)
        host_indices, device_indices, pool_transfers = self._move_write_operation(op)
        self.write_queue.clear()
        completion = self.l2_transfer_engine.submit_device_to_host(
            self._l2_transfers(host_indices, device_indices, pool_transfers))
        self.ack_write_queue.append(self._ack(completion, op))

    def _ack(self, completion, op):
        return HiCacheAck(start_event=completion.start_event,
                          finish_event=completion.finish_event, node_ids=op.node_ids,
                          num_tokens=len(op.device_indices),
                          timing_enabled=completion.timing_enabled,
                          num_tokens_by_pool=self._num_tokens_by_pool(op),
                          num_bytes=self._transfer_num_bytes(op))

    def _transfer_num_bytes(self, op):
        return len(op.device_indices) * self.mem_pool_host.size_per_token

    def _num_tokens_by_pool(self, op):
        return {PoolName.KV.value: len(op.device_indices)}

    # -- host -> device ------------------------------------------------------------

    def load(self, host_indices, priority=None, node_id=-1):
        """Device slots for host_indices (loaded by start_loading), or None."""
        device_indices = self.mem_pool_device_allocator.alloc(len(host_indices))
        if device_indices is None:
            return None
        self.load_queue.append(CacheOperation(host_indices, device_indices, node_id, priority))
        return device_indices

    def move_indices(self, host_indices, device_indices):
        if self.io_backend == "kernel":
            if not host_indices.is_cuda:
                host_indices = host_indices.to(self.device, non_blocking=True)
            return host_indices, device_indices
        if self.io_backend == "direct":
            if self.mem_pool_host.layout == "layer_first":
                device_indices = device_indices.cpu()
                host_indices, order = host_indices.sort()
                return host_indices, device_indices.index_select(0, order)
            if self.mem_pool_host.layout == "page_first_direct":
                return host_indices, device_indices.cpu()
            raise ValueError(f"Unsupported layout {self.mem_pool_host.layout!r} for io "
                             "backend 'direct'")
        if self.io_backend == "kernel_ascend":
            return host_indices, device_indices.cpu()
        raise ValueError("Unsupported io backend")

    def _move_write_operation(self, op):
        if (self.io_backend == "kernel" and self.mem_pool_host.layout == "page_first"
                and getattr(self.mem_pool_host, "can_use_write_back_jit", False)):
            return op.host_indices, op.device_indices, op.pool_transfers
        return self._move_op_indices(op)

    def _move_op_indices(self, op):
        return (*self.move_indices(op.host_indices, op.device_indices), None)

    def _l2_transfers(self, host_indices, device_indices, pool_transfers=None):
        return [L2Transfer(host_pool=self.mem_pool_host, device_pool=self.mem_pool_device,
                           host_indices=host_indices, device_indices=device_indices)]

    def _l2_load_transfers(self, host_indices, device_indices, pool_transfers=None):
        return self._l2_transfers(host_indices, device_indices, pool_transfers)

    def start_loading(self):
        """Submits the queued loads; the LayerDoneCounter slot they signal
        (-1 when nothing was queued)."""
        if not self.load_queue:
            return -1
        producer_id = self.layer_done_counter.update_producer()
        op = CacheOperation.merge_ops(self.load_queue)
        host_indices, device_indices, pool_transfers = self._move_op_indices(op)
        self.load_queue.clear()
        producer_event = self.layer_done_counter.events[producer_id]
        producer_event.start_event.record()
        transfers = self._l2_load_transfers(host_indices, device_indices, pool_transfers)
        if self.transfer_layer_id_max is None:
            completion = self.l2_transfer_engine.submit_host_to_device(
                transfers, start_event=producer_event.start_event,
                on_layer_done=producer_event.complete, layer_num=self.layer_num)
        else:
            completion = self.l2_transfer_engine.submit_host_to_device(
                transfers, transfer_layer_id_max=self.transfer_layer_id_max,
                start_event=producer_event.start_event, on_layer_done=producer_event.complete)
        self.ack_load_queue.append(self._ack(completion, op))
        return producer_id

    def evict_device(self, device_indices):
        self.mem_pool_device_allocator.free(device_indices)
        return len(device_indices)

    def evict_host(self, host_indices, backup_only=True):
        if not backup_only:
            raise ValueError("Other eviction policies are not supported yet.")
        self.mem_pool_host.free(host_indices)
        return len(host_indices)

    # -- storage -> host (prefetch) ----------------------------------------------------

    def prefetch(self, request_id, new_input_tokens, last_hash=None, prefix_keys=None,
                 router_hint=None):
        operation = PrefetchOperation(request_id, new_input_tokens, last_hash, prefix_keys,
                                      router_hint=router_hint)
        self.prefetch_queue.put(operation)
        return operation

    def terminate_prefetch(self, operation):
        operation.mark_terminate()
        return operation.completed_tokens, operation.hash_value

    def append_host_mem_release(self, host_indices):
        if host_indices.numel() == 0:
            return
        for page in host_indices.split(self.mem_pool_host.page_size):
            self.host_mem_release_queue.put(page)

    def _page_get_zero_copy(self, operation, hash_values, host_indices, extra_info=None):
        results = self.storage_backend.batch_get_v1(hash_values, host_indices, extra_info)
        loaded = 0
        for key, ok in zip(hash_values, results):
            if not ok:
                logger.warning("Prefetch operation %s failed to retrieve page %s.",
                               operation.request_id, key)
                break
            loaded += 1
        return loaded

    def _generic_page_get(self, operation, hash_values, host_indices, extra_info=None):
        targets = [self.storage_host_pool.get_dummy_flat_data_page() for _ in hash_values]
        page_data = self.storage_backend.batch_get(hash_values, targets)
        if page_data is None:
            return 0
        loaded = 0
        for i, key in enumerate(hash_values):
            if page_data[i] is None:
                logger.warning("Prefetch operation %s failed to retrieve page %s.",
                               operation.request_id, key)
                break
            if operation.is_terminated():
                break
            self.storage_host_pool.set_from_flat_data_page(host_indices[i * self.page_size],
                                                           page_data[i])
            loaded += 1
        return loaded

    def _page_transfer(self, operation):
        prefix_keys = operation.prefix_keys
        kv_derived = [t for t in getattr(operation, "pool_transfers", None) or []
                      if t.indices_from_pool == PoolName.KV]
        ok = True
        completed_pages = 0
        for start in range(0, len(operation.hash_value), STORAGE_BATCH_SIZE):
            # Every batch yields one ack, also after a failure: the sync thread
            # all-reduces them, so all ranks must send as many.
            if ok and operation.is_terminated():
                ok = False
            if ok:
                batch = operation.hash_value[start:start + STORAGE_BATCH_SIZE]
                host = operation.host_indices[start * self.page_size:
                                              (start + len(batch)) * self.page_size]
                extra_info = HiCacheStorageExtraInfo(
                    prefix_keys=prefix_keys, extra_info=_router_hint_extra_info(operation))
                hits = self._page_transfer_kv_batch(operation, batch, host, extra_info,
                                                    kv_derived)
                if hits != len(batch):
                    ok = False
                if prefix_keys:
                    prefix_keys += batch
                completed_pages += hits
            self.prefetch_sync_queue.put(PrefetchAck(
                rid=operation.request_id, completed_tokens=completed_pages * self.page_size,
                operation=operation))
        return completed_pages

    def _page_transfer_kv_batch(self, operation, batch_hashes, batch_host_indices, extra_info,
                                kv_derived_transfers):
        kv_hits = self.page_get_func(operation, batch_hashes, batch_host_indices, extra_info)
        sidecar_hits = {}
        if kv_derived_transfers:
            results = self.storage_backend.batch_get_v2(
                [PoolTransfer(name=t.name, host_indices=batch_host_indices, keys=batch_hashes)
                 for t in kv_derived_transfers])
            sidecar_hits = count_pool_hits(results)
        return min([kv_hits, *sidecar_hits.values()])

    def prefetch_io_aux_func(self):
        while not self.storage_stop_event.is_set():
            try:
                operation = self.prefetch_buffer.get(block=True, timeout=1)
            except Empty:
                continue
            if operation is None:
                continue
            self._page_transfer(operation)
            self.prefetch_sync_queue.put(PrefetchAck(rid=operation.request_id,
                                                     completed_req=True, operation=operation))

    def prefetch_rate_limited(self):
        if self.host_memory_mode == "buffer_only":
            used = self.mem_pool_host.size - self.mem_pool_host.available_size()
            if self.host_write_staged_tokens_fn is not None:
                used -= self.host_write_staged_tokens_fn()
            return max(0, used) >= self.prefetch_capacity_limit
        if self.prefetch_tokens_occupied >= self.prefetch_capacity_limit:
            now = time.monotonic()
            if now - self._last_rate_limit_log_s >= _RATE_LIMIT_LOG_INTERVAL_S:
                self._last_rate_limit_log_s = now
                logger.warning("HiCache prefetch rate-limited: %d/%d host tokens reserved.",
                               self.prefetch_tokens_occupied, self.prefetch_capacity_limit)
            return True
        return False

    def _storage_hit_query(self, operation):
        """(the page keys found, from the first; how many tokens they hold)."""
        prefix_keys = operation.prefix_keys.copy() if operation.prefix_keys else None
        page_hashes = self.get_hash_str(operation.token_ids, operation.last_hash,
                                        page_size=self.page_size)
        operation.all_hash_values = page_hashes
        found, tokens = [], 0
        for start in range(0, len(page_hashes), STORAGE_BATCH_SIZE):
            batch = page_hashes[start:start + STORAGE_BATCH_SIZE]
            extra_info = HiCacheStorageExtraInfo(prefix_keys=prefix_keys,
                                                 extra_info=_router_hint_extra_info(operation))
            hits = self.storage_backend.batch_exists(batch, extra_info)
            found.extend(batch[:hits])
            tokens += hits * self.page_size
            if hits < len(batch):
                break
            if prefix_keys:
                prefix_keys += batch
        return found, tokens

    def prefetch_thread_func(self):
        while not self.storage_stop_event.is_set() or not self.prefetch_queue.empty():
            try:
                operation = self.prefetch_queue.get(block=True, timeout=1)
            except Empty:
                continue
            if operation is None:
                continue
            if operation.is_terminated():
                hash_value, hits = [], 0
            else:
                hash_value, hits = self._storage_hit_query(operation)
            hits_tensor = torch.tensor(hits, dtype=torch.int)
            self._all_reduce(hits_tensor, torch.distributed.ReduceOp.MIN,
                             self.prefetch_hits_sync_groups)
            hits = hits_tensor.item()
            # The scheduler decides (revoke below the threshold, else allocate).
            operation.hash_value = hash_value[:hits // self.page_size]
            operation.storage_hit_count = hits
            self.prefetch_hit_queue.put(operation)

    # -- host -> storage (backup) ------------------------------------------------------

    def write_storage(self, host_indices, token_ids, hash_value=None, prefix_keys=None):
        operation = StorageOperation(host_indices, token_ids, hash_value=hash_value,
                                     prefix_keys=prefix_keys)
        self.backup_queue.put(operation)
        return operation.id

    def _generic_page_set(self, hash_values, host_indices, extra_info=None):
        data = [self.storage_host_pool.get_data_page(host_indices[i * self.page_size])
                for i in range(len(hash_values))]
        return self.storage_backend.batch_set(hash_values, data)

    def _page_set_zero_copy(self, hash_values, host_indices, extra_info=None):
        return all(self.storage_backend.batch_set_v1(hash_values, host_indices, extra_info))

    def _page_backup(self, operation):
        prefix_keys = operation.prefix_keys
        for start in range(0, len(operation.hash_value), STORAGE_BATCH_SIZE):
            batch = operation.hash_value[start:start + STORAGE_BATCH_SIZE]
            host = operation.host_indices[start * self.page_size:
                                          (start + len(batch)) * self.page_size]
            extra_info = HiCacheStorageExtraInfo(prefix_keys=prefix_keys)
            if not self.page_set_func(batch, host, extra_info):
                logger.warning("Write page to storage: %d pages failed.", len(batch))
                break
            if prefix_keys:
                prefix_keys += batch
            operation.completed_tokens += self.page_size * len(batch)

    def backup_thread_func(self):
        while not self.storage_stop_event.is_set():
            try:
                operation = self.backup_queue.get(block=True, timeout=1)
            except Empty:
                continue
            if operation is None:
                continue
            if not self.backup_skip:
                self._page_backup(operation)
            self.ack_backup_queue.put(operation)

    def prefetch_sync_thread_func(self):
        while not self.storage_stop_event.is_set():
            try:
                ack = self.prefetch_sync_queue.get(block=True, timeout=1)
            except Empty:
                continue
            if ack is None:
                continue
            self._reduce_prefetch_ack(ack)
            self.ack_prefetch_queue.put(ack)

    def _reduce_prefetch_ack(self, ack):
        if ack.completed_tokens is not None:
            tokens = torch.tensor(ack.completed_tokens, dtype=torch.int)
            self._all_reduce(tokens, torch.distributed.ReduceOp.MIN,
                             self.prefetch_completion_sync_groups)
            ack.completed_tokens = tokens.item()


class HiCacheControllerTransferLayerIdMax(HiCacheController):
    """The controller the 086fe1aa engine pairs with: 001067ff's, with the
    086fe1aa L2TransferEngine and submit_host_to_device(...,
    transfer_layer_id_max=self.transfer_layer_id_max) (= layer_num here:
    no packed draft layers)."""

    l2_engine_class = L2TransferEnginePhysical
    uses_transfer_layer_id_max = True


# The L2 engine version -> the controller class that drives it.
CONTROLLERS = {"67e863cd": HiCacheController, "086fe1aa": HiCacheControllerTransferLayerIdMax}
