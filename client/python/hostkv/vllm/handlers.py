"""The worker side: one RankStore per vLLM worker process (one hostkv
session), registering the worker's canonical KV tensors once as the device
buffers of its rank's blocks pool, and two OffloadingHandlers on it:
GPU -> hostkv (stores) and hostkv -> GPU (loads).

transfer_async makes one or two calls and returns; it never waits for a
copy. A store allocates pages (the daemon evicts for it), submits a backup
and, when get_finished sees it done, publishes the pages under the blocks'
keys (a key another instance published meanwhile keeps that instance's
page; ours is freed). A load takes its own references on the blocks
(Lookup with acquire in its rank's namespace; the scheduler's references
keep them cached until then), submits the load, and releases them when it
is done. Jobs finish in submission order (hostkvd runs a session's
operations in order).

A killed worker leaves nothing pinned: its session's pages that were not
published yet are freed once their copies end, and its references go.
"""
import collections
import logging
import time

from vllm.v1.kv_offload.mediums import GPULoadStoreSpec
from vllm.v1.kv_offload.worker.worker import OffloadingHandler, TransferResult

from .. import errors
from .blocks import check_block_ids, slot_runs
from .mediums import HostkvLoadStoreSpec

logger = logging.getLogger("hostkv.vllm")

_STORE = ("GPU", "CPU")
_LOAD = ("CPU", "GPU")


def _one_group(spec, what):
    sizes = getattr(spec, "group_sizes", None)
    if sizes is not None and len(sizes) != 1:
        raise errors.InvalidArgument(
            f"{what}: blocks of {len(sizes)} KV cache groups; hostkv.vllm serves one")


class _Job:
    __slots__ = ("job_id", "kind", "op", "pages", "keys", "parent", "bytes", "start",
                 "failed")

    def __init__(self, job_id, kind, op, pages, keys, parent, nbytes, failed=False):
        self.job_id = job_id
        self.kind = kind
        self.op = op
        self.pages = pages  # runs
        self.keys = keys
        self.parent = parent
        self.bytes = nbytes
        self.start = time.monotonic()
        self.failed = failed


class RankStore:
    """One worker's blocks pool, import and session; the jobs of both
    handlers, in submission order."""

    def __init__(self, client, pool, namespace, import_id, num_blocks, block_bytes,
                 num_tensors, factor, signals=None):
        self.client = client
        self.pool = pool
        self.namespace = namespace
        self.import_id = import_id
        self.num_blocks = num_blocks
        self.row_bytes = block_bytes * num_tensors  # one engine block, all tensors
        self.factor = factor
        self.signals = signals  # hostkv.cuda.GpuSignals on CUDA, else None
        self.jobs = collections.OrderedDict()  # job_id -> _Job
        self.store_skipped = 0  # blocks a full pool could not take

    # -- submission -----------------------------------------------------

    def store(self, job_id, src, dst):
        if not isinstance(src, GPULoadStoreSpec) or not isinstance(dst, HostkvLoadStoreSpec):
            raise errors.InvalidArgument(f"a store goes GPU -> hostkv, got {src!r} -> {dst!r}")
        _one_group(src, f"store job {job_id}")
        ids = check_block_ids(src.block_ids, self.num_blocks, f"store job {job_id}")
        if len(ids) != len(dst.keys) * self.factor:
            raise errors.InvalidArgument(
                f"store job {job_id}: {len(ids)} GPU blocks for {len(dst.keys)} offloaded "
                f"blocks of {self.factor}")
        if not ids:
            self.jobs[job_id] = _Job(job_id, "store", None, [], [], b"", 0)
            return True
        try:
            pages = self.client.alloc(self.pool, len(ids))
        except errors.ResourceExhausted as e:
            # vLLM has no failed jobs: the job ends, storing nothing, and
            # lookups will not find these blocks.
            logger.warning("store job %d: %s; %d blocks not offloaded", job_id, e,
                           len(dst.keys))
            self.store_skipped += len(dst.keys)
            self.jobs[job_id] = _Job(job_id, "store", None, [], [], b"", 0)
            return True
        try:
            options = {}
            if self.signals is not None:
                # Copy once the compute stream has written the KV, no host sync.
                options["wait_kv_written"] = self.signals.mark_kv_written()
            op = self.client.backup(self.pool, self.import_id, pages, slot_runs(ids),
                                    progress_at_end=True, **options)
        except BaseException:
            self.client.free(self.pool, pages)
            raise
        self.jobs[job_id] = _Job(job_id, "store", op, pages, dst.keys, dst.parent,
                                 len(ids) * self.row_bytes)
        return True

    def load(self, job_id, src, dst):
        if not isinstance(src, HostkvLoadStoreSpec) or not isinstance(dst, GPULoadStoreSpec):
            raise errors.InvalidArgument(f"a load goes hostkv -> GPU, got {src!r} -> {dst!r}")
        _one_group(dst, f"load job {job_id}")
        ids = check_block_ids(dst.block_ids, self.num_blocks, f"load job {job_id}")
        indices = getattr(dst, "block_indices", None)
        if self.factor > 1 and indices and int(indices[0]) % self.factor:
            raise errors.Unimplemented(
                f"load job {job_id} starts inside an offloaded block (GPU block index "
                f"{int(indices[0])} of {self.factor}): hostkv.vllm loads whole offloaded "
                "blocks; leave extra_config block_size unset")
        if len(ids) != len(src.keys) * self.factor:
            raise errors.InvalidArgument(
                f"load job {job_id}: {len(ids)} GPU blocks for {len(src.keys)} offloaded "
                f"blocks of {self.factor}")
        if not ids:
            self.jobs[job_id] = _Job(job_id, "load", None, [], [], b"", 0)
            return True
        found = self.client.lookup(self.pool, self.namespace, src.keys, acquire=True)
        if found.hits < len(src.keys):
            if found.pages:
                self.client.release(self.pool, found.pages)
            # Reported failed (not refused), so that vLLM does not compute on
            # blocks that never arrived.
            logger.error("load job %d: %d of %d blocks are no longer cached", job_id,
                         len(src.keys) - found.hits, len(src.keys))
            self.jobs[job_id] = _Job(job_id, "load", None, [], [], b"", 0, failed=True)
            return True
        try:
            op = self.client.load(self.pool, self.import_id, found.pages, slot_runs(ids),
                                  progress_at_end=True)
        except BaseException:
            self.client.release(self.pool, found.pages)
            raise
        self.jobs[job_id] = _Job(job_id, "load", op, found.pages, src.keys, b"",
                                 len(ids) * self.row_bytes)
        return True

    # -- completion -----------------------------------------------------

    def finished(self, kind):
        """Results of this kind's jobs done since the last call, in order."""
        out = []
        for job in list(self.jobs.values()):
            if job.kind != kind:
                continue
            if not self._done(job, timeout=0):
                break
            out.append(self._finish(job))
        return out

    def wait(self, job_ids, kind):
        for job in list(self.jobs.values()):
            if job.kind == kind and job.job_id in job_ids and job.op is not None:
                self._done(job, timeout=None)

    def _done(self, job, timeout):
        if job.op is None:
            return True
        try:
            self.client.wait(job.op, timeout=60.0 if timeout is None else timeout)
            return True
        except errors.DeadlineExceeded:
            if timeout is None:
                raise
            return False
        except errors.HostKVError as e:  # aborted: the daemon went away
            logger.error("job %d: %s", job.job_id, e)
            job.failed = True
            return True

    def _finish(self, job):
        del self.jobs[job.job_id]
        if job.op is not None:
            try:
                if job.kind == "store" and not job.failed:
                    self._publish(job)
                elif job.kind == "store":  # the copy failed: the pages go back
                    self.client.free(self.pool, job.pages)
                elif job.kind == "load":
                    self.client.release(self.pool, job.pages)
            except errors.HostKVError as e:
                logger.error("job %d: %s", job.job_id, e)
                job.failed = job.failed or job.kind == "load"
        return TransferResult(job.job_id, not job.failed, job.bytes,
                              time.monotonic() - job.start,
                              _STORE if job.kind == "store" else _LOAD)

    def _publish(self, job):
        # One host page per offloaded block (page_size = the block's engine
        # blocks), chained in request order.
        parents = [job.parent or None] + list(job.keys[:-1])
        published = self.client.publish(self.pool, self.namespace, job.keys, job.pages,
                                        parent_keys=parents)
        if published.uncached_pages:  # published by another instance meanwhile
            self.client.free(self.pool, published.uncached_pages)

    def close(self):
        """Waits for the jobs in flight, then unregisters and closes."""
        for job in list(self.jobs.values()):
            try:
                self._done(job, timeout=None)
                self._finish(job)
            except errors.HostKVError:
                pass
        try:
            self.client.unregister_device_buffers(self.import_id)
        except errors.HostKVError:
            pass
        if self.signals is not None:
            self.signals.release()
        self.client.close()


class HostkvStoreHandler(OffloadingHandler):
    """GPU -> hostkv."""

    def __init__(self, store):
        self.store = store

    def transfer_async(self, job_id, spec):
        return self.store.store(job_id, *spec)

    def get_finished(self):
        return self.store.finished("store")

    def wait(self, job_ids):
        self.store.wait(set(job_ids), "store")

    def shutdown(self):
        self.store.close()


class HostkvLoadHandler(OffloadingHandler):
    """hostkv -> GPU."""

    def __init__(self, store):
        self.store = store

    def transfer_async(self, job_id, spec):
        return self.store.load(job_id, *spec)

    def get_finished(self):
        return self.store.finished("load")

    def wait(self, job_ids):
        self.store.wait(set(job_ids), "load")

    def shutdown(self):
        return  # the store handler's shutdown closes the shared RankStore
