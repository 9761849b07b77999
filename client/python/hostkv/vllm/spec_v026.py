"""HostkvOffloadingSpec for vLLM v0.26+ (vllm/v1/kv_offload/base.py,
OffloadingSpec(config: OffloadingConfig)).

    --kv-transfer-config '{"kv_connector": "OffloadingConnector",
      "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "HostkvOffloadingSpec", "spec_module_path": "hostkv.vllm",
        "cpu_bytes_to_use": 8589934592}}'

Options (kv_connector_extra_config) are listed in README.md beside this
file. vLLM builds the spec in its scheduler and in every worker: the
constructor is cheap and connects nowhere. get_manager (scheduler) and
get_worker (each worker, once its KV caches exist) open the hostkv
sessions.
"""
import logging

from vllm.v1.kv_offload import base as vbase

from .. import errors
from ..client import Client
from .manager_v026 import HostkvManager
from .._owned_names import owner_prefix
from .placement import GroupPlacement
from .registration import attach_blocks_pool, register_tensors, warn_if_hashes_unseeded
from .worker_v026 import GroupBuffers, HostkvWorker

logger = logging.getLogger("hostkv.vllm")

DEFAULT_CAPACITY_BYTES = 1 << 30


class HostkvOffloadingSpec(vbase.OffloadingSpec):
    # The connector's worker reads this whenever the KV cache is packed or
    # cross-layer; vLLM's base class does not define it. False: a packed
    # cache is offloaded as one region per block.
    compact_group_layout = False

    def __init__(self, config):
        super().__init__(config)
        extra = self.extra_config
        self._target = extra.get("hostkv_target") or None
        self._placement = GroupPlacement(
            config, extra=str(extra.get("hostkv_namespace", "")),
            pool_prefix=str(extra.get("hostkv_pool_prefix", "vllm")),
            owner=owner_prefix(self._target, bool(extra.get("hostkv_shared_names", False))))
        total = int(extra.get("cpu_bytes_to_use", extra.get("hostkv_capacity_bytes",
                                                            DEFAULT_CAPACITY_BYTES)))
        if total <= 0:
            raise ValueError(f"cpu_bytes_to_use must be positive, got {total}")
        self._capacity_per_rank = max(1, total // self._placement.world_size)
        self._hold_seconds = float(extra.get("hostkv_hold_seconds", 5.0))
        self._retry_for = float(extra.get("hostkv_lookup_wait_seconds", 0.5))
        self._engine_id = str(getattr(config, "engine_id", "") or "engine")
        self._manager = None

    # -- scheduler ------------------------------------------------------

    def get_manager(self):
        if self._manager is None:
            warn_if_hashes_unseeded()
            def connect():
                return Client(self._target, client_name=f"vllm-{self._engine_id}-scheduler")

            self._manager = HostkvManager(
                connect(), self._placement, self.blocks_per_chunk,
                events=self.kv_events_config.enable_kv_cache_events,
                hold_seconds=self._hold_seconds, retry_for=self._retry_for, connect=connect)
            logger.info("hostkv.vllm scheduler of %s: groups %s, %d rank(s), namespaces %s",
                        self._engine_id, list(self._placement.group_ids),
                        self._placement.world_size,
                        self._placement.namespace(self._placement.group_ids[0], 0))
        return self._manager

    # -- workers --------------------------------------------------------

    def get_worker(self, kv_caches):
        rank = int(self.extra_config.get("hostkv_rank", self.config.parallel.rank))
        rank %= self._placement.world_size
        groups = _group_tensors(kv_caches, len(self._placement.group_ids))
        num_blocks = int(kv_caches.tensors[0].tensor.shape[0])

        def connect():
            return self._connect_worker(rank, groups, num_blocks)

        client, buffers = connect()
        logger.info("hostkv.vllm rank %d of %s: %d KV blocks, groups %s", rank,
                    self._engine_id, num_blocks,
                    {g.group_id: f"{g.pool} ({g.row_bytes} B/block)" for g in buffers.values()})
        return HostkvWorker(client, buffers, dict(self._placement.positions),
                            self.blocks_per_chunk, num_blocks, rank, reconnect=connect)

    def _connect_worker(self, rank, groups, num_blocks):
        """A worker session with every group's pool attached and its KV
        tensors registered: (client, {position: GroupBuffers})."""
        per_block = [len(ts) * row for ts, row in groups]
        client = Client(self._target, client_name=f"vllm-{self._engine_id}-r{rank}")
        buffers = {}
        try:
            for pos, ((tensors, row), gid) in enumerate(zip(groups, self._placement.group_ids)):
                if not tensors:
                    continue
                capacity = max(row * len(tensors),
                               self._capacity_per_rank * per_block[pos] // sum(per_block))
                buffers[pos] = self._register_group(client, gid, rank, tensors, row,
                                                    num_blocks, capacity)
        except BaseException:
            client.close()
            raise
        return client, buffers

    def _register_group(self, client, gid, rank, tensors, row, num_blocks, capacity):
        pool = self._placement.pool(gid, rank)
        namespace = self._placement.namespace(gid, rank)
        attach_blocks_pool(client, pool, len(tensors), row, 1, capacity)
        import_id, signals = register_tensors(client, pool, num_blocks, tensors)
        return GroupBuffers(gid, pool, namespace, import_id, row * len(tensors), signals)


def _group_tensors(kv_caches, num_groups):
    """Per offloaded group: (its distinct KV tensors in ref order, row
    bytes). InvalidArgument (the engine does not start) for what hostkv
    cannot copy: rows that are not contiguous, or one group with tensors
    of different page sizes or block counts."""
    tensors = getattr(kv_caches, "tensors", None)
    refs = getattr(kv_caches, "group_data_refs", None)
    if tensors is None or refs is None:
        raise errors.InvalidArgument(
            f"get_worker needs vLLM's CanonicalKVCaches, got {type(kv_caches).__name__}")
    if len(refs) != num_groups:
        raise errors.InvalidArgument(
            f"CanonicalKVCaches has {len(refs)} groups, the OffloadingConfig {num_groups}")
    if not tensors:
        raise errors.InvalidArgument("vLLM gave no KV cache tensors to offload")
    num_blocks = {int(t.tensor.shape[0]) for t in tensors}
    if len(num_blocks) != 1:
        raise errors.InvalidArgument(f"KV tensors of different block counts {num_blocks}")
    out = []
    for gi, group_refs in enumerate(refs):
        seen, group, rows = set(), [], set()
        for ref in group_refs:
            idx = int(ref.tensor_idx)
            if not 0 <= idx < len(tensors):
                raise errors.InvalidArgument(f"group {gi}: tensor index {idx} out of range")
            if idx in seen:
                continue
            seen.add(idx)
            t = tensors[idx].tensor
            page = int(tensors[idx].page_size_bytes)
            if t.dim() != 2 or t.element_size() != 1:
                raise errors.InvalidArgument(
                    f"group {gi}: a canonical KV tensor is (num_blocks, page) bytes, got "
                    f"{tuple(t.shape)} of {t.dtype}")
            if t.stride() != (t.shape[1], 1) or t.shape[1] != page:
                raise errors.InvalidArgument(
                    f"group {gi}: KV blocks of {t.shape[1]} bytes lie {t.stride(0)} bytes "
                    "apart; hostkv copies whole contiguous blocks (a packed layout must "
                    "come as one tensor per block, compact_group_layout False)")
            group.append(t)
            rows.add(page)
        if len(rows) > 1:
            raise errors.InvalidArgument(
                f"KV cache group {gi} has tensors of different page sizes {sorted(rows)}: "
                "hostkv keeps one page geometry per group")
        out.append((group, rows.pop() if rows else 0))
    devices = {str(t.device) for group, _ in out for t in group}
    if len(devices) > 1:
        raise errors.InvalidArgument(f"KV tensors on several devices: {sorted(devices)}")
    return out
