"""HostkvWorker: vLLM v0.26+'s OffloadingWorker (vllm/v1/kv_offload/base.py)
on hostkvd. One per vLLM worker process (rank): one hostkv session, and per
offloaded KV cache group a blocks pool with the group's KV tensors
registered as its device buffers (one token slot per GPU block).

vLLM has no failed jobs (a submit returning False or a TransferResult with
success=False kills the engine), so:
  submit_store/submit_load  check the job, queue it, return True. The
                    worker's forward pass never waits on the daemon: a
                    thread of this worker (the only user of its session)
                    makes the calls, one job after another.
  a store           per group: Alloc (the daemon evicts the coldest
                    unreferenced pages for it), Backup, wait, Publish under
                    the page keys (a key another instance published
                    meanwhile keeps that page; ours is freed). A full pool,
                    a bad job or hostkvd away: the job stores nothing and
                    is reported done (vLLM then asks the daemon, which is
                    the truth, at its next lookup).
  a load            per group: Lookup(acquire) in this rank's namespace,
                    Load, wait, Release. Reported done only once every
                    byte is in the GPU blocks. Pages that cannot be found
                    (the daemon lost its state, or a job vLLM's manager
                    did not hold) are never replaced by anything: the job
                    is asked again every RETRY_SECONDS and stays unfinished
                    (the request waits; logged as an error), so no request
                    computes on stale KV.
  wait(job_ids)     blocks until those jobs no longer read the GPU blocks
                    (unknown ids are ignored, as vLLM passes loads and
                    finished jobs too).
"""
import logging
import queue
import threading
import time

from vllm.v1.kv_offload import base as vbase

from .. import errors
from .blocks import slot_runs
from .chunks import split_job

logger = logging.getLogger("hostkv.vllm")

RETRY_SECONDS = 0.5
WAIT_SECONDS = 300.0


class GroupBuffers:
    """One offloaded KV cache group on this rank: its pool, namespace,
    import and row bytes (all of the group's tensors, one GPU block)."""

    def __init__(self, group_id, pool, namespace, import_id, row_bytes, signals=None):
        self.group_id = group_id
        self.pool = pool
        self.namespace = namespace
        self.import_id = import_id
        self.row_bytes = row_bytes
        self.signals = signals


class _Job:
    __slots__ = ("job_id", "kind", "keys", "gpu", "kv_written", "done", "bytes", "start",
                 "stored")

    def __init__(self, job_id, kind, keys, gpu, kv_written):
        self.job_id = job_id
        self.kind = kind
        self.keys = keys
        self.gpu = gpu
        self.kv_written = kv_written  # per group position: the KV-written mark (CUDA)
        self.done = threading.Event()
        self.bytes = 0
        self.start = time.monotonic()
        self.stored = 0


class HostkvWorker(vbase.OffloadingWorker):
    def __init__(self, client, groups, positions, blocks_per_chunk, num_blocks, rank):
        self._client = client
        self._groups = groups          # position -> GroupBuffers
        self._positions = positions    # key group id -> position
        self._f = int(blocks_per_chunk)
        self._num_blocks = int(num_blocks)
        self._rank = rank
        self._jobs = {}                # job_id -> _Job, submitted and not yet reported
        self._finished = []            # TransferResults not yet taken
        self._lock = threading.Lock()
        self._queue = queue.Queue()
        self.stores_skipped = 0        # keys a store could not keep
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"hostkv-vllm-worker-r{rank}")
        self._thread.start()

    # -- vLLM's calls -------------------------------------------------------

    def submit_store(self, job_id, src_spec, dst_spec):
        return self._submit(job_id, "store", dst_spec, src_spec)

    def submit_load(self, job_id, src_spec, dst_spec):
        return self._submit(job_id, "load", src_spec, dst_spec)

    def get_finished(self):
        with self._lock:
            out, self._finished = self._finished, []
        return out

    def wait(self, job_ids):
        for job_id in job_ids:
            with self._lock:
                job = self._jobs.get(job_id)
            if job is not None and not job.done.wait(WAIT_SECONDS):
                logger.error("job %d is still running after %.0f s", job_id, WAIT_SECONDS)

    def shutdown(self):
        self._queue.put(None)
        self._thread.join(timeout=WAIT_SECONDS)
        for g in self._groups.values():
            try:
                self._client.unregister_device_buffers(g.import_id)
            except errors.HostKVError:
                pass
            if g.signals is not None:
                g.signals.release()
        self._client.close()

    # -- submission (vLLM's thread) ------------------------------------------

    def _submit(self, job_id, kind, blocks, gpu):
        keys = list(getattr(blocks, "keys", ()))
        job = _Job(int(job_id), kind, keys, gpu, {})
        if kind == "store":
            for pos, g in self._groups.items():
                if g.signals is not None:  # copy once the compute stream wrote the KV
                    job.kv_written[pos] = g.signals.mark_kv_written()
        with self._lock:
            self._jobs[job.job_id] = job
        self._queue.put(job)
        return True

    # -- the worker's thread ---------------------------------------------------

    def _run(self):
        waiting = []  # loads whose pages could not be found yet
        while True:
            try:
                job = self._queue.get(timeout=RETRY_SECONDS if waiting else None)
            except queue.Empty:
                job = False
            if job is None:
                return
            if job:
                self._do(job, waiting)
            if waiting and (job is False or time.monotonic() - waiting[0][1] > RETRY_SECONDS):
                again, waiting[:] = [j for j, _ in waiting], []
                for j in again:
                    self._do(j, waiting)

    def _do(self, job, waiting):
        try:
            if job.kind == "store":
                self._store(job)
                done = True
            else:
                done = self._load(job)
        except Exception:  # pylint: disable=broad-except
            logger.exception("job %d (%s)", job.job_id, job.kind)
            done = job.kind == "store"  # never report a load whose bytes did not arrive
        if done:
            self._report(job)
        else:
            waiting.append((job, time.monotonic()))

    def _report(self, job):
        job.done.set()
        with self._lock:
            self._jobs.pop(job.job_id, None)
            self._finished.append(vbase.TransferResult(
                job_id=job.job_id, success=True, transfer_size=job.bytes,
                transfer_time=time.monotonic() - job.start))

    def _runs(self, job):
        return split_job(job.keys, job.gpu, self._positions, self._f, self._num_blocks,
                         f"{job.kind} job {job.job_id}")

    def _store(self, job):
        try:
            runs = self._runs(job)
        except errors.HostKVError as e:
            logger.error("%s; nothing stored", e.message)
            return
        for run in runs:
            g = self._groups[run.position]
            try:
                self._store_group(job, g, run)
            except errors.HostKVError as e:
                self.stores_skipped += len(run.page_keys)
                logger.warning("store job %d, group %d: %s %s; %d blocks not offloaded",
                               job.job_id, g.group_id, e.code_name, e.message,
                               len(run.block_ids))

    def _store_group(self, job, g, run):
        pages = self._client.alloc(g.pool, len(run.block_ids))
        try:
            options = {}
            if job.kv_written.get(run.position):
                options["wait_kv_written"] = job.kv_written[run.position]
            op = self._client.backup(g.pool, g.import_id, pages, slot_runs(run.block_ids),
                                     progress_at_end=True, **options)
            self._client.wait(op, timeout=WAIT_SECONDS)
        except BaseException:
            self._free_quietly(g.pool, pages)
            raise
        job.bytes += len(run.block_ids) * g.row_bytes
        try:
            published = self._client.publish(g.pool, g.namespace, run.page_keys, pages)
        except BaseException:
            self._free_quietly(g.pool, pages)
            raise
        if published.uncached_pages:  # published by another instance meanwhile
            self._free_quietly(g.pool, published.uncached_pages)
        job.stored += len(run.page_keys)

    def _free_quietly(self, pool, pages):
        try:
            self._client.free(pool, pages)
        except errors.HostKVError as e:
            logger.warning("freeing %d pages of %s: %s", sum(n for _, n in pages), pool, e)

    def _load(self, job):
        """True once every byte is in the GPU blocks; False to try again
        (pages not found: nothing was copied)."""
        try:
            runs = self._runs(job)
        except errors.InvalidArgument as e:
            # A job this worker cannot even read: nothing it could ever copy.
            logger.error("%s; the job is reported done with its blocks untouched", e.message)
            return True
        held = []
        try:
            for run in runs:  # every group's pages first: all or nothing
                g = self._groups[run.position]
                found = self._client.lookup(g.pool, g.namespace, run.page_keys, acquire=True)
                held.append((g, found.pages))
                if found.hits < len(run.page_keys):
                    if job.start + RETRY_SECONDS > time.monotonic() or not job.stored:
                        job.stored = 1  # logged once
                        logger.error(
                            "load job %d: %d of %d blocks of group %d are not cached in %s; "
                            "the load waits for them (the request does not go on with "
                            "stale KV)", job.job_id, len(run.page_keys) - found.hits,
                            len(run.page_keys), g.group_id, g.namespace)
                    return False
            ops = [self._client.load(g.pool, g.import_id, pages, slot_runs(run.block_ids),
                                     progress_at_end=True)
                   for (g, pages), run in zip(held, runs)]
            for op in ops:
                self._client.wait(op, timeout=WAIT_SECONDS)
        finally:
            for g, pages in held:
                if pages:
                    try:
                        self._client.release(g.pool, pages)
                    except errors.HostKVError as e:
                        logger.debug("release after load: %s", e)
        job.bytes = sum(len(run.block_ids) * g.row_bytes for (g, _), run in zip(held, runs))
        return True
