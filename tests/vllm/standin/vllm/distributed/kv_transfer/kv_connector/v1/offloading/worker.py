"""Models OffloadingConnectorWorker, .../kv_connector/v1/offloading/worker.py
at vllm-project/vllm 0078e9d2 (checked against base.py @0105e232: every name
it imports exists there; it reads spec.compact_group_layout, which that base
does not define).

register_kv_caches: per offloaded group and layer, an int8 (num_blocks,
page) view of the layer's blocks; layers whose views alias (same address and
strides, e.g. one layer of each group of a hybrid model sharing a tensor)
become one CanonicalKVCacheTensor; per group one CanonicalKVCacheRef per
layer (unpadded page size); spec.get_worker(CanonicalKVCaches) once. A
packed layout (block stride > page) becomes one tensor of whole blocks,
unless spec.compact_group_layout.
Per step: handle_preemptions (submit every deferred store, then
wait(jobs_to_flush)), start_kv_transfers (last step's deferred stores first,
then this step's loads), prepare_store_kv (this step's stores deferred to
the next step), get_finished (asserts every TransferResult.success; loads
are reported as finished receiving), build_connector_worker_meta (the
completed job ids)."""
from collections import defaultdict

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata)
from vllm.v1.kv_offload.base import (CanonicalKVCacheRef, CanonicalKVCaches,
                                     CanonicalKVCacheTensor, GPULoadStoreSpec)


class OffloadingConnectorWorker:
    def __init__(self, spec, kv_cache_config):
        self.spec = spec
        self.kv_cache_config = kv_cache_config
        self.worker = None
        self._is_store_writer = (not spec.replicated_layout
                                 or spec.config.parallel.rank == 0)
        self._load_jobs = {}
        self._unsubmitted_store_jobs = []
        self._meta = OffloadingWorkerMetadata()

    def register_kv_caches(self, kv_caches):
        kcc = self.kv_cache_config
        num_blocks = kcc.num_blocks
        views, pages = {}, {}
        for group in kcc.kv_cache_groups:
            spec = group.kv_cache_spec
            for name in group.layer_names:
                t = kv_caches[name]
                assert t.shape[0] == num_blocks
                page = spec.page_size_bytes
                stride = t.stride(0) * t.element_size()
                # upstream: an empty int8 tensor set_() on the layer's
                # untyped storage; the same view through as_strided here (the
                # Debian torch predates untyped_storage)
                views[name] = t.view(torch.int8).as_strided(
                    (num_blocks, page), (stride, 1), t.storage_offset() * t.element_size())
                pages[name] = (page, spec.unpadded_page_size_bytes)
        packed = next((n for n, v in views.items() if v.stride(0) != v.shape[1]), None)
        if packed is not None and not self.spec.compact_group_layout:
            v = views[packed]
            whole = v.as_strided((num_blocks, v.stride(0)), (v.stride(0), 1), 0)
            self.worker = self.spec.get_worker(CanonicalKVCaches(
                [CanonicalKVCacheTensor(whole, v.stride(0))],
                [[CanonicalKVCacheRef(0, v.stride(0))] for _ in kcc.kv_cache_groups]))
            return
        tensors, refs = [], defaultdict(list)
        aliased = defaultdict(list)
        for name, v in views.items():
            aliased[(v.data_ptr(), v.stride())].append(name)
        for names in aliased.values():
            tensors.append(CanonicalKVCacheTensor(views[names[0]], pages[names[0]][0]))
            for name in names:
                refs[name].append(CanonicalKVCacheRef(len(tensors) - 1, pages[name][1]))
        group_refs = [[r for name in g.layer_names for r in refs[name]]
                      for g in kcc.kv_cache_groups]
        self.worker = self.spec.get_worker(CanonicalKVCaches(tensors, group_refs))

    def handle_preemptions(self, metadata):
        for job_id in metadata.jobs_to_flush:
            entry = metadata.store_jobs.pop(job_id, None)
            if entry is not None:
                if not self._is_store_writer:
                    self._meta.mark_completed(job_id)
                    continue
                self._unsubmitted_store_jobs.append((job_id, entry.src_spec, entry.dst_spec))
        for job_id, src, dst in self._unsubmitted_store_jobs:
            assert isinstance(src, GPULoadStoreSpec)
            success = self.worker.submit_store(job_id, src, dst)
            assert success
        self._unsubmitted_store_jobs.clear()
        if metadata.jobs_to_flush:
            self.worker.wait(metadata.jobs_to_flush)

    def start_kv_transfers(self, metadata):
        for job_id, src, dst in self._unsubmitted_store_jobs:
            success = self.worker.submit_store(job_id, src, dst)
            assert success
        self._unsubmitted_store_jobs.clear()
        for job_id, entry in metadata.load_jobs.items():
            self._load_jobs[job_id] = entry.req_id
            assert isinstance(entry.dst_spec, GPULoadStoreSpec)
            success = self.worker.submit_load(job_id, entry.src_spec, entry.dst_spec)
            assert success

    def prepare_store_kv(self, metadata):
        for job_id, entry in metadata.store_jobs.items():
            if not self._is_store_writer:
                self._meta.mark_completed(job_id)
                continue
            self._unsubmitted_store_jobs.append((job_id, entry.src_spec, entry.dst_spec))

    def get_finished(self, finished_req_ids):
        finished_recving = set()
        for result in self.worker.get_finished():
            # "we currently do not support job failures"
            assert result.success
            self._meta.mark_completed(result.job_id)
            req_id = self._load_jobs.pop(result.job_id, None)
            if req_id is not None:
                finished_recving.add(req_id)
        return set(), finished_recving

    def build_connector_worker_meta(self):
        if not self._meta.completed_jobs:
            return None
        meta, self._meta = self._meta, OffloadingWorkerMetadata()
        return meta

    def shutdown(self):
        self._unsubmitted_store_jobs.clear()
        self._load_jobs.clear()
        if self.worker is not None:
            self.worker.shutdown()
