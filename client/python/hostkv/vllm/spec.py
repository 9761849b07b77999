"""HostkvOffloadingSpec: vLLM's OffloadingSpec on hostkvd.

    --kv-transfer-config '{"kv_connector": "OffloadingConnector",
      "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "HostkvOffloadingSpec", "spec_module_path": "hostkv.vllm",
        "cpu_bytes_to_use": 8589934592}}'

Options (kv_connector_extra_config, beside spec_name/spec_module_path):
  cpu_bytes_to_use      host bytes for this model and layout, all ranks
                        together (vLLM's own option name; each rank's pool
                        gets 1/world_size). Default 1 GiB. A pool that
                        another instance made first keeps its size.
  hostkv_target         the daemon (default $HOSTKV_TARGET, else
                        unix:/run/hostkv/hostkvd.sock).
  hostkv_namespace      extra text for the namespace (e.g. a weights
                        version): instances share blocks only with the
                        same text. Default "".
  hostkv_pool_prefix    pool names start with it (default "vllm").
  hostkv_hold_seconds   how long a lookup's references wait for the
                        prepare_load that claims them (default 5).
  block_size            vLLM's offloaded block size (tokens), a multiple of
                        the GPU block size; loads must then start on an
                        offloaded block (hostkv.vllm refuses others).

The spec is built in the scheduler and in every worker (vLLM makes one per
connector role); the constructor is cheap and connects nowhere. Both
constructor signatures are served: spec_cls(vllm_config, kv_cache_config)
(vLLM v0.14-v0.20) and spec_cls(vllm_config) (v0.11-v0.13).
"""
import inspect
import logging

import torch

from vllm.v1.kv_offload.mediums import GPULoadStoreSpec
from vllm.v1.kv_offload.spec import OffloadingSpec

from .. import errors
from .._owned_names import owner_prefix
from ..client import Client
from .blocks import check_tensors
from .handlers import HostkvLoadHandler, HostkvStoreHandler, RankStore
from .manager import HostkvOffloadingManager
from .registration import attach_blocks_pool, register_tensors, warn_if_hashes_unseeded
from .mediums import HostkvLoadStoreSpec
from .naming import InstanceLayout

logger = logging.getLogger("hostkv.vllm")

DEFAULT_CAPACITY_BYTES = 1 << 30


def _base_takes_kv_cache_config():
    return "kv_cache_config" in inspect.signature(OffloadingSpec.__init__).parameters


class HostkvOffloadingSpec(OffloadingSpec):
    def __init__(self, vllm_config, kv_cache_config=None):
        if not _base_takes_kv_cache_config():
            super().__init__(vllm_config)  # vLLM v0.11-v0.13
        elif kv_cache_config is not None:
            super().__init__(vllm_config, kv_cache_config)
        else:
            # A newer base constructed the old way: set what it would.
            self.vllm_config = vllm_config
            self.kv_cache_config = None
            self.extra_config = vllm_config.kv_transfer_config.kv_connector_extra_config
            self.hash_block_size = vllm_config.cache_config.block_size
            self.gpu_block_size = (vllm_config.cache_config.block_size,)
            self.block_size_factor = 1
            offloaded = self.extra_config.get("block_size")
            if offloaded is not None:
                if int(offloaded) % self.gpu_block_size[0]:
                    raise ValueError(f"block_size {offloaded} is not a multiple of the GPU "
                                     f"block size {self.gpu_block_size[0]}")
                self.block_size_factor = int(offloaded) // self.gpu_block_size[0]
        gpu_block = self.gpu_block_size
        if isinstance(gpu_block, (tuple, list)):
            if len(set(gpu_block)) != 1:
                raise ValueError(f"KV cache groups of different block sizes {gpu_block}: "
                                 "hybrid models are not supported by hostkv.vllm")
            gpu_block = gpu_block[0]
        self._gpu_block = int(gpu_block)
        factor = getattr(self, "block_size_factor", None)
        if factor is None:  # v0.11-v0.13 keep offloaded_block_size instead
            factor = int(getattr(self, "offloaded_block_size", gpu_block)) // self._gpu_block
        self._factor = int(factor)
        extra = self.extra_config
        self._target = extra.get("hostkv_target") or None
        self._layout = InstanceLayout.of(
            vllm_config, self._gpu_block, self._gpu_block * self._factor,
            extra=str(extra.get("hostkv_namespace", "")),
            pool_prefix=str(extra.get("hostkv_pool_prefix", "vllm")),
            owner=owner_prefix(self._target, bool(extra.get("hostkv_shared_names", False))))
        total = int(extra.get("cpu_bytes_to_use", extra.get("hostkv_capacity_bytes",
                                                            DEFAULT_CAPACITY_BYTES)))
        self._capacity_per_rank = max(1, total // self._layout.world_size)
        self._hold_seconds = float(extra.get("hostkv_hold_seconds", 5.0))
        self._manager = None

    # -- scheduler ------------------------------------------------------

    def get_manager(self):
        if self._manager is None:
            warn_if_hashes_unseeded()
            events = self.vllm_config.kv_events_config
            client = Client(self._target, client_name="vllm-scheduler")
            self._manager = HostkvOffloadingManager(
                client, self._layout, self._gpu_block * self._factor,
                events=bool(events and events.enable_kv_cache_events),
                hold_seconds=self._hold_seconds,
                load_timeout_seconds=float(self.extra_config.get("load_timeout_seconds", 30.0)))
        return self._manager

    # -- workers --------------------------------------------------------

    def get_handlers(self, kv_caches, attn_backends=None):
        tensors = self._canonical_tensors(kv_caches)
        num_blocks, block_bytes = check_tensors(tensors)
        # The worker's rank in its instance's TP x PP world (a rank counted
        # across data-parallel replicas maps to its place in its replica).
        rank = int(self.extra_config.get("hostkv_rank",
                                         getattr(self.vllm_config.parallel_config, "rank", 0)))
        rank %= self._layout.world_size
        pool = self._layout.pool(rank)
        namespace = self._layout.namespace(rank)
        client = Client(self._target, client_name=f"vllm-worker-r{rank}")
        try:
            attach_blocks_pool(client, pool, len(tensors), block_bytes, self._factor,
                               self._capacity_per_rank)
            import_id, signals = register_tensors(client, pool, num_blocks, tensors)
        except BaseException:
            client.close()
            raise
        logger.info("hostkv.vllm rank %d: %d KV tensors of %d blocks x %d bytes in pool %s, "
                    "namespace %s", rank, len(tensors), num_blocks, block_bytes, pool, namespace)
        store = RankStore(client, pool, namespace, import_id, num_blocks, block_bytes,
                          len(tensors), self._factor, signals)
        yield GPULoadStoreSpec, HostkvLoadStoreSpec, HostkvStoreHandler(store)
        yield HostkvLoadStoreSpec, GPULoadStoreSpec, HostkvLoadHandler(store)

    def _canonical_tensors(self, kv_caches):
        groups = getattr(self.kv_cache_config, "kv_cache_groups", None)
        refs = getattr(kv_caches, "group_data_refs", None)
        if (groups is not None and len(groups) > 1) or (refs is not None and len(refs) > 1):
            raise errors.InvalidArgument(
                f"{max(len(groups or ()), len(refs or ()))} KV cache groups: hybrid models "
                "(several KV cache groups) are not supported by hostkv.vllm")
        tensors = getattr(kv_caches, "tensors", None)
        if tensors is not None:  # CanonicalKVCaches (v0.14+)
            return [t.tensor for t in tensors]
        if isinstance(kv_caches, dict):  # layer name -> KV cache (v0.11-v0.13)
            out = []
            num_blocks = getattr(self.vllm_config.cache_config, "num_gpu_blocks", None)
            for name, t in kv_caches.items():
                # FlashAttention (2, num_blocks, ...): K and V apart; else
                # (num_blocks, ...): one tensor.
                halves = t.unbind(0) if t.shape[0] == 2 and t.shape[1] == (
                    num_blocks or t.shape[1]) and t.dim() >= 3 else (t,)
                for h in halves:
                    if not h.is_contiguous():
                        raise errors.InvalidArgument(f"KV cache {name} is not contiguous")
                    out.append(h.reshape(h.shape[0], -1).view(torch.int8))
            return out
        raise errors.InvalidArgument(
            f"get_handlers needs CanonicalKVCaches or a dict of tensors, got {type(kv_caches)}")
