"""A HiRadixCache-like driver, modelled on
python/sglang/srt/mem_cache/hiradix_cache.py at
39baee9e09735ebb7916f64ceb00dbfe395ab52b: how it builds the host pool and
the controller, and the scheduler-thread steps it takes around the
controller. There is no radix tree: callers pass the indices a tree node
would hold.

- build_token_to_kv_pool_host: by isinstance on the device pool (MHA
  first, then MLA), cls(kv_cache, hicache_ratio, hicache_size, page_size,
  hicache_mem_layout, allocator_type=hicache_storage_backend,
  host_page_num=params.hicache_host_page_num) -- exactly that call; for
  MHA the class is get_mha_host_pool_cls(kv_cache)'s.
- _parse_storage_backend_extra_config pops prefetch_threshold (default
  256), prefetch_timeout_base / _per_ki_token and
  hicache_storage_pass_prefix_keys from the JSON extra config.
- the HiCacheController is built with 39baee9e's arguments.
- write_backup: cc.write(device_indices=, node_id=) and, when the host
  pool is full, evict_host then one retry; writing_check: the acks whose
  finish_event.query() is true, in order, each finish_event.synchronize()d;
  load_back: cc.load(host_indices=, node_id=) (the device is evicted by the
  caller when it is full); ready_to_load_host_cache: cc.start_loading();
  loading_check like writing_check; write_backup_storage:
  cc.write_storage(host_value, token_ids, hash_value, prefix_keys);
  query_storage_hit_length: cc._storage_hit_query on the scheduler thread;
  drain_storage_control_queues: backup acks, host_mem_release (freed).

Mismatches handled here, as the notes record them: hiradix@39baee9e was
written against a controller between 350cb879 and 001067ff (3-field acks,
prefetch(request_id, host_indices, ...), prefetch_revoke_queue). The
driver speaks 001067ff's API: acks by field name; prefetch(request_id,
tokens, last_hash, prefix_keys), then (from the hit queue) the host
allocation of storage_hit_count tokens and prefetch_buffer.put(op) -- how
001067ff's tree cache does that step is inferred (its hiradix was not
stored); completed tokens from the PrefetchAcks.
"""
import dataclasses
import json
import threading
from queue import Empty
from typing import Optional

import torch

from ..managers.cache_controller import HiCacheController, PrefetchOperation
from .hicache_storage import PrefetchTimeoutConfig
from .memory_pool import MHATokenToKVPool, MLATokenToKVPool
from .pool_host.mha import get_mha_host_pool_cls


@dataclasses.dataclass
class ServerArgs:
    """The server arguments hiradix_cache.py reads (SGLang's names)."""
    hicache_ratio: float = 2.0
    hicache_size: int = 0
    hicache_mem_layout: str = "layer_first"
    hicache_io_backend: str = "kernel"
    hicache_write_policy: str = "write_through"
    hicache_storage_backend: Optional[str] = None
    hicache_storage_backend_extra_config: Optional[str] = None  # JSON
    served_model_name: Optional[str] = None


@dataclasses.dataclass
class CacheInitParams:
    token_to_kv_pool_allocator: object
    page_size: int
    hicache_host_page_num: Optional[int] = None
    tp_cache_group: object = None
    attn_cp_cache_group: object = None
    attn_tp_cache_group: object = None
    pp_cache_group: object = None


@dataclasses.dataclass
class HostPoolClasses:
    """The classes SGLang's modules name (what install() rebinds)."""
    MHATokenToKVPoolHost: object
    MLATokenToKVPoolHost: object
    AsymmetricMHATokenToKVPoolHost: object = None


def build_token_to_kv_pool_host(kv_cache, server_args, params, classes):
    args = (kv_cache, server_args.hicache_ratio, server_args.hicache_size, params.page_size,
            server_args.hicache_mem_layout)
    kwargs = {"allocator_type": server_args.hicache_storage_backend,
              "host_page_num": params.hicache_host_page_num}
    if isinstance(kv_cache, MHATokenToKVPool):
        cls = get_mha_host_pool_cls(kv_cache, classes.MHATokenToKVPoolHost,
                                    classes.AsymmetricMHATokenToKVPoolHost)
        return cls(*args, **kwargs)
    if isinstance(kv_cache, MLATokenToKVPool):
        return classes.MLATokenToKVPoolHost(*args, **kwargs)
    raise ValueError("HiRadixCache only supports MHA, MLA, DSA, and MSA models")


def parse_storage_backend_extra_config(extra_config_json):
    """(extra_config, prefetch_threshold, PrefetchTimeoutConfig, pass_prefix_keys)."""
    extra = json.loads(extra_config_json) if extra_config_json else {}
    threshold = extra.pop("prefetch_threshold", 256)
    timeout = PrefetchTimeoutConfig(base=extra.pop("prefetch_timeout_base", 2.0),
                                    per_ki_token=extra.pop("prefetch_timeout_per_ki_token", 0.1))
    pass_prefix_keys = extra.pop("hicache_storage_pass_prefix_keys", False)
    return extra, threshold, timeout, pass_prefix_keys


class HiRadixDriver:
    def __init__(self, params, server_args, classes, controller_cls=HiCacheController):
        self.page_size = params.page_size
        self.kv_cache = params.token_to_kv_pool_allocator.get_kvcache()
        self.token_to_kv_pool_host = build_token_to_kv_pool_host(self.kv_cache, server_args,
                                                                 params, classes)
        self.tp_group = params.tp_cache_group
        self.enable_storage = server_args.hicache_storage_backend is not None
        (extra_config, prefetch_threshold, self.prefetch_timeout_config,
         self.pass_prefix_keys) = parse_storage_backend_extra_config(
             server_args.hicache_storage_backend_extra_config)
        self.load_cache_event = threading.Event()
        try:
            self.cache_controller = controller_cls(
                params.token_to_kv_pool_allocator, self.token_to_kv_pool_host, self.page_size,
                self.tp_group, load_cache_event=self.load_cache_event,
                attn_cp_group=params.attn_cp_cache_group,
                attn_tp_group=params.attn_tp_cache_group, pp_group=params.pp_cache_group,
                write_policy=server_args.hicache_write_policy,
                io_backend=server_args.hicache_io_backend,
                storage_backend=server_args.hicache_storage_backend,
                prefetch_threshold=prefetch_threshold,
                model_name=server_args.served_model_name,
                storage_backend_extra_config=extra_config, enable_storage_metrics=False)
        except BaseException:
            self._close_host_pool()  # stand-in only: a test's daemon keeps no pool
            raise
        self.ongoing_write_through = {}
        self.ongoing_load_back = {}
        self.ongoing_backup = {}
        self.write_through_threshold = 1 if server_args.hicache_write_policy == "write_through" \
            else 2

    # -- device <-> host ---------------------------------------------------------

    def evict_host(self, host_indices):
        return self.cache_controller.evict_host(host_indices)

    def write_backup(self, device_indices, node_id, evictable_host=None):
        """cc.write; when the host pool is full, evict `evictable_host` (what
        a tree's evictable host leaves would give) and retry once."""
        cc = self.cache_controller
        host_indices = cc.write(device_indices=device_indices, node_id=node_id)
        if host_indices is None and evictable_host is not None:
            self.evict_host(evictable_host)
            host_indices = cc.write(device_indices=device_indices, node_id=node_id)
        if host_indices is not None:
            self.ongoing_write_through[node_id] = host_indices.clone()
        return host_indices

    def _finished(self, acks):
        count = 0
        for ack in acks:
            if not ack.finish_event.query():
                break
            count += 1
        done = []
        for _ in range(count):
            ack = acks.pop(0)
            ack.finish_event.synchronize()
            done.extend(ack.node_ids)
        return done

    def writing_check(self):
        """The node ids whose write-through finished."""
        done = self._finished(self.cache_controller.ack_write_queue)
        for node_id in done:
            self.ongoing_write_through.pop(node_id, None)
        return done

    def load_back(self, host_indices, node_id):
        device_indices = self.cache_controller.load(host_indices=host_indices, node_id=node_id)
        if device_indices is not None:
            self.ongoing_load_back[node_id] = device_indices
        return device_indices

    def ready_to_load_host_cache(self):
        return self.cache_controller.start_loading()

    def is_load_back_event_done(self, consumer_index):
        if consumer_index < 0:
            return True
        events = self.cache_controller.layer_done_counter.events
        if not events[consumer_index].finish_event.query():
            return False
        self.loading_check()
        return True

    def loading_check(self):
        done = self._finished(self.cache_controller.ack_load_queue)
        for node_id in done:
            self.ongoing_load_back.pop(node_id, None)
        return done

    # -- host <-> storage ----------------------------------------------------------

    def write_backup_storage(self, host_value, token_ids, hash_value, prefix_keys=None):
        op_id = self.cache_controller.write_storage(host_value, token_ids, hash_value,
                                                    prefix_keys)
        self.ongoing_backup[op_id] = host_value
        return op_id

    def wait_backup(self, op_id, timeout):
        """The StorageOperation op_id, from ack_backup_queue."""
        while True:
            op = self._get(self.cache_controller.ack_backup_queue, timeout)
            self.ongoing_backup.pop(op.id, None)
            if op.id == op_id:
                return op

    def query_storage_hit_length(self, new_input_tokens, last_hash=None, prefix_keys=None):
        cc = self.cache_controller
        if not self.enable_storage or cc.prefetch_rate_limited():
            return [], 0
        # 39baee9e builds the op with an empty host-index tensor:
        empty = self.token_to_kv_pool_host.get_dummy_flat_data_page()[:0]
        assert empty.numel() == 0
        op = PrefetchOperation("__storage_hit_query__", new_input_tokens, last_hash,
                               prefix_keys)
        hashes, hits = cc._storage_hit_query(op)  # pylint: disable=protected-access
        return hashes, hits - hits % self.page_size

    def prefetch_from_storage(self, req_id, new_input_tokens, last_hash=None, prefix_keys=None):
        cc = self.cache_controller
        if (not self.enable_storage or len(new_input_tokens) < cc.prefetch_threshold
                or cc.prefetch_rate_limited()):
            return None
        op = cc.prefetch(req_id, new_input_tokens, last_hash, prefix_keys)
        cc.prefetch_tokens_occupied += len(new_input_tokens)
        return op

    def drain_prefetch_hit(self, timeout):
        """The next op off prefetch_hit_queue: below the threshold revoked
        (host_indices None), else host pages for its hits and queued for
        the page transfer."""
        cc = self.cache_controller
        op = self._get(cc.prefetch_hit_queue, timeout)
        if op.storage_hit_count >= cc.prefetch_threshold:
            op.host_indices = self.token_to_kv_pool_host.alloc(op.storage_hit_count)
            if op.host_indices is not None:
                cc.prefetch_buffer.put(op)
                return op
        cc.prefetch_tokens_occupied -= len(op.token_ids)
        return op

    def wait_prefetch(self, op, timeout):
        """op's PrefetchAcks up to the completed_req one; sets
        op.completed_tokens from the last count."""
        acks = []
        while True:
            ack = self._get(self.cache_controller.ack_prefetch_queue, timeout)
            if ack.rid != op.request_id:
                continue
            acks.append(ack)
            if ack.completed_tokens is not None:
                op.completed_tokens = ack.completed_tokens
            if ack.completed_req:
                return acks

    def check_prefetch_progress(self, op):
        """Ends op: its completed tokens; the host pages past them released."""
        cc = self.cache_controller
        completed, _ = cc.terminate_prefetch(op)
        cc.append_host_mem_release(op.host_indices[completed:])
        cc.prefetch_tokens_occupied -= len(op.token_ids)
        return completed

    def drain_storage_control_queues(self):
        cc = self.cache_controller
        backups = []
        while not cc.ack_backup_queue.empty():
            op = cc.ack_backup_queue.get_nowait()
            self.ongoing_backup.pop(op.id, None)
            backups.append(op)
        pages = []
        while not cc.host_mem_release_queue.empty():
            pages.append(cc.host_mem_release_queue.get_nowait())
        if pages:
            self.token_to_kv_pool_host.free(torch.cat(pages))
        return backups

    def _get(self, queue, timeout):
        try:
            return queue.get(timeout=timeout)
        except Empty:
            errors = self.cache_controller.storage_thread_errors
            raise AssertionError(
                f"nothing on the queue after {timeout}s; storage threads died of: "
                f"{errors!r}") from None

    # -- end -----------------------------------------------------------------------

    def shutdown(self):
        """Stops the storage threads (detach), then closes the host pool
        (close() is hostkv's: it ends the pool's session)."""
        try:
            if getattr(self, "cache_controller", None) is not None and \
                    self.cache_controller.enable_storage:
                self.cache_controller.detach_storage_backend()
        finally:
            self._close_host_pool()

    def _close_host_pool(self):
        close = getattr(self.token_to_kv_pool_host, "close", None)
        if close is not None:
            close()
