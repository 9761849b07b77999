"""HostkvWorker: vLLM v0.26+'s OffloadingWorker (vllm/v1/kv_offload/base.py)
on hostkvd. One per vLLM worker process (rank): one hostkv session, and per
offloaded KV cache group a blocks pool with the group's KV tensors
registered as its device buffers (one token slot per GPU block).

vLLM has no failed jobs (a submit returning False or a TransferResult with
success=False kills the engine), so:
  submit_store/submit_load  check nothing that could fail, queue the job,
                    return True. The forward pass never waits on the
                    daemon: a thread of this worker (the only user of its
                    session) makes the calls, one job after another.
  a store           per group: Alloc (the daemon evicts the coldest
                    unreferenced pages for it), Backup, wait, Publish under
                    the page keys (a key another instance published
                    meanwhile keeps that page; ours is freed). A full pool,
                    hostkvd away (checked first: stores never wait for the
                    daemon), a lost session or a bad job: the job stores
                    nothing and is reported done; the next lookup asks the
                    daemon, which is the truth.
  a load            per group: Lookup(acquire) in this rank's namespace,
                    Load, wait, Release. Reported done only once every
                    byte is in the GPU blocks. A load whose pages are not
                    all there copies nothing and is tried again every
                    RETRY_SECONDS (the daemon restarting, a session being
                    resumed); after LOAD_GIVE_UP_SECONDS it is never copied
                    and never reported (logged as critical): its request
                    waits rather than compute on stale KV.
  wait(job_ids)     (vLLM's fence before it reuses GPU blocks) blocks until
                    those jobs no longer read the GPU blocks, at most
                    WAIT_SECONDS in all. A job still queued then is
                    cancelled (it copies nothing); a store whose copy could
                    not be waited for never publishes. Unknown ids (loads,
                    finished jobs) are ignored.
Releases and frees that fail while hostkvd is away are retried, so no
reference or page outlives the job that took it. A lost session (a daemon
that came back without this session's state) is replaced by a new one,
with the KV tensors registered again.
"""
import logging
import queue
import threading
import time

from vllm.v1.kv_offload import base as vbase

from .. import errors
from .._pace import Pace
from ..cache_calls import page_list, page_runs
from .blocks import slot_runs
from .chunks import split_job

logger = logging.getLogger("hostkv.vllm")

RETRY_SECONDS = 0.5
LOAD_GIVE_UP_SECONDS = 60.0
WAIT_SECONDS = 60.0
OP_SECONDS = 300.0
RECONNECT_SECONDS = 5.0


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
                 "copying", "cancelled", "no_publish", "complained")

    def __init__(self, job_id, kind, keys, gpu, kv_written):
        self.job_id = job_id
        self.kind = kind
        self.keys = keys
        self.gpu = gpu
        self.kv_written = kv_written  # per group position: the KV-written mark (CUDA)
        self.done = threading.Event()
        self.bytes = 0
        self.start = time.monotonic()
        self.copying = False     # a copy of it may be running in the daemon
        self.cancelled = False   # a fence gave up on it before it copied: never copy
        self.no_publish = False  # a fence gave up on it while it copied
        self.complained = False


class HostkvWorker(vbase.OffloadingWorker):
    def __init__(self, client, groups, positions, blocks_per_chunk, num_blocks, rank,
                 reconnect=None):
        self._client = client
        self._groups = groups          # position -> GroupBuffers
        self._positions = positions    # key group id -> position
        self._f = int(blocks_per_chunk)
        self._num_blocks = int(num_blocks)
        self._rank = rank
        self._reconnect = reconnect    # () -> (client, groups): a new session
        self._reconnects = Pace(RECONNECT_SECONDS)
        self._jobs = {}                # job_id -> _Job, submitted and not yet reported
        self._finished = []            # TransferResults not yet taken
        self._lock = threading.Lock()
        self._queue = queue.Queue()
        self._releases = []            # [(pool, pages)] to release again
        self._frees = []               # [(pool, runs)] to free again
        self.stores_skipped = 0        # page keys a store could not keep
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
        deadline = time.monotonic() + WAIT_SECONDS
        for job_id in job_ids:
            with self._lock:
                job = self._jobs.get(job_id)
            if job is None:
                continue
            if job.done.wait(max(0.0, deadline - time.monotonic())):
                continue
            with self._lock:
                if job.done.is_set():
                    continue
                if not job.copying:
                    job.cancelled = True  # it will copy nothing
                    logger.warning("fence: job %d cancelled before it copied", job_id)
                    continue
                if job.kind == "store":
                    job.no_publish = True  # its bytes may be the blocks' next contents
                    logger.warning("fence: store job %d still copying after %.0f s: it "
                                   "will publish nothing", job_id, WAIT_SECONDS)
                    continue
            # A load copying into blocks vLLM wants back: they must not be
            # written after this returns.
            if not job.done.wait(OP_SECONDS):
                logger.critical("fence: load job %d still copying after %.0f s more",
                                job_id, OP_SECONDS)

    def shutdown(self):
        self._queue.put(None)
        self._thread.join(timeout=OP_SECONDS)
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
            idle = waiting or self._releases or self._frees
            try:
                job = self._queue.get(timeout=RETRY_SECONDS if idle else None)
            except queue.Empty:
                job = False
            if job is None:
                return
            self._settle()
            if job:
                self._do(job, waiting)
            if waiting and (job is False or time.monotonic() - waiting[0][1] > RETRY_SECONDS):
                again, waiting[:] = [j for j, _ in waiting], []
                for j in again:
                    self._do(j, waiting)

    def _do(self, job, waiting):
        try:
            if job.cancelled:
                done = job.kind == "store"  # a cancelled load is never reported
            elif job.kind == "store":
                self._store(job)
                done = True
            else:
                done = self._load(job)
        except errors.SessionLost as e:
            logger.error("job %d (%s): %s", job.job_id, job.kind, e)
            self._session_lost()
            done = job.kind == "store"
        except Exception:  # pylint: disable=broad-except
            logger.exception("job %d (%s)", job.job_id, job.kind)
            done = job.kind == "store"  # never report a load whose bytes did not arrive
        if done:
            self._report(job)
        elif time.monotonic() - job.start > LOAD_GIVE_UP_SECONDS:
            logger.critical("load job %d: its blocks did not come back in %.0f s; it will "
                            "never be copied nor reported (its request waits, rather than "
                            "compute on stale KV)", job.job_id, LOAD_GIVE_UP_SECONDS)
            with self._lock:
                job.cancelled = True
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

    def _start_copy(self, job):
        """Marks the job copying; False if a fence cancelled it first."""
        with self._lock:
            if job.cancelled:
                return False
            job.copying = True
            return True

    # -- stores ---------------------------------------------------------------

    def _store(self, job):
        if self._client.daemon_away or self._client.session_lost:
            self.stores_skipped += len(job.keys)
            return  # stores are optional: never wait for the daemon
        try:
            runs = self._runs(job)
        except errors.HostKVError as e:
            logger.error("%s; nothing stored", e.message)
            return
        for run in runs:
            g = self._groups[run.position]
            try:
                self._store_group(job, g, run)
            except errors.SessionLost:
                raise
            except errors.HostKVError as e:
                self.stores_skipped += len(run.page_keys)
                logger.warning("store job %d, group %d: %s %s; %d blocks not offloaded",
                               job.job_id, g.group_id, e.code_name, e.message,
                               len(run.block_ids))

    def _store_group(self, job, g, run):
        pages = self._client.alloc(g.pool, len(run.block_ids), wait=False)
        if not self._start_copy(job):
            self._free(g.pool, pages)
            return
        try:
            options = {}
            if job.kv_written.get(run.position):
                options["wait_kv_written"] = job.kv_written[run.position]
            op = self._client.backup(g.pool, g.import_id, pages, slot_runs(run.block_ids),
                                     progress_at_end=True, **options)
            self._client.wait(op, timeout=OP_SECONDS)
            with self._lock:
                publish = not job.no_publish
            if publish:
                published = self._client.publish(g.pool, g.namespace, run.page_keys, pages)
        except BaseException:
            self._free(g.pool, pages)
            raise
        if not publish:
            self._free(g.pool, pages)
            return
        job.bytes += len(run.block_ids) * g.row_bytes
        if published.uncached_pages:  # published by another instance meanwhile
            self._free(g.pool, published.uncached_pages)

    # -- loads ----------------------------------------------------------------

    def _load(self, job):
        """True once every byte is in the GPU blocks; False to try again
        (pages not found: nothing was copied)."""
        try:
            runs = self._runs(job)
        except errors.InvalidArgument as e:
            # Keys and GPU blocks that do not pair up: nothing could ever be
            # copied for it, and reporting it would serve the blocks' old bytes.
            if not job.complained:
                job.complained = True
                logger.critical("%s; the load is never reported", e.message)
            return False
        held = []
        try:
            for run in runs:  # every group's pages first: all or nothing
                g = self._groups[run.position]
                found = self._client.lookup(g.pool, g.namespace, run.page_keys, acquire=True)
                held.append((g, found.pages))
                if found.hits < len(run.page_keys):
                    if not job.complained:
                        job.complained = True
                        logger.error(
                            "load job %d: %d of %d blocks of group %d are not cached in %s; "
                            "the load waits for them (the request does not go on with "
                            "stale KV)", job.job_id, len(run.page_keys) - found.hits,
                            len(run.page_keys), g.group_id, g.namespace)
                    return False
            if not self._start_copy(job):
                return False
            ops = [self._client.load(g.pool, g.import_id, pages, slot_runs(run.block_ids),
                                     progress_at_end=True)
                   for (g, pages), run in zip(held, runs)]
            for op in ops:
                self._client.wait(op, timeout=OP_SECONDS)
        finally:
            for g, pages in held:
                if pages:
                    self._release(g.pool, pages)
        job.bytes = sum(len(run.block_ids) * g.row_bytes for (g, _), run in zip(held, runs))
        return True

    # -- references, pages, sessions ------------------------------------------

    def _release(self, pool, runs):
        try:
            self._client.release(pool, runs)
        except errors.FailedPrecondition:
            # Release is all or nothing; a resume may have dropped one of
            # them (its key moved): give back the others one by one.
            for page in page_list(runs):
                try:
                    self._client.release(pool, [(page, 1)])
                except errors.FailedPrecondition:
                    pass
                except errors.HostKVError:
                    self._releases.append((pool, [(page, 1)]))
        except errors.HostKVError:
            self._releases.append((pool, runs))  # hostkvd away: again later

    def _free(self, pool, runs):
        try:
            self._client.free(pool, runs)
        except errors.FailedPrecondition as e:
            logger.warning("freeing %d pages of %s: %s", len(page_list(runs)), pool, e)
        except errors.HostKVError:
            self._frees.append((pool, runs))

    def _settle(self):
        """Releases and frees that failed while hostkvd was away, again; a
        new session if this one was lost."""
        if self._client.session_lost:
            self._session_lost()
            return
        if self._client.daemon_away:
            return
        releases, self._releases = self._releases, []
        for pool, runs in releases:
            self._release(pool, runs)
        frees, self._frees = self._frees, []
        for pool, runs in frees:
            self._free(pool, page_runs(page_list(runs)))

    def _session_lost(self):
        """The daemon no longer knows this session (it came back without its
        state): its references and pages went with it. A new session with
        the KV tensors registered again, at most every RECONNECT_SECONDS."""
        self._releases, self._frees = [], []
        if self._reconnect is None or not self._reconnects.due():
            return
        try:
            client, groups = self._reconnect()
        except errors.HostKVError as e:
            logger.warning("rank %d: no new hostkv session yet: %s", self._rank, e)
            return
        old, self._client, self._groups = self._client, client, groups
        old.close()
        logger.warning("rank %d: hostkvd lost this worker's session; a new one has the KV "
                       "tensors registered again", self._rank)
