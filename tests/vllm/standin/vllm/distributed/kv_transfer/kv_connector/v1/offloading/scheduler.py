"""Models OffloadingConnectorScheduler, .../kv_connector/v1/offloading/
scheduler.py at vllm-project/vllm 0105e232 (read in full), for full-attention
and sliding-window groups. Left out: Mamba align/partial-tail keys, EAGLE
groups, DCP/PCP, kv_hints, tier filters, metrics, the convergence passes
(one pass: groups are asked once per call).

Keys: per group, chunk i (tokens_per_block * blocks_per_chunk tokens) keyed
by the request's block hash at index (i+1)*hashes_per_chunk - 1 plus the
group id (4 bytes big-endian); ReqContext records each key's end token.
Lookup (get_num_new_matched_tokens): nothing while the request has a job in
flight (None); full-attention groups first, front to back: HIT and
HIT_PENDING count, RETRY marks "defer" and the scan goes on, MISS stops;
sliding-window groups (largest window first) back to front until `window`
consecutive hits. Any defer, or a HIT_PENDING with
max_recompute_pending_tokens 0, returns None (asked again next step); a
group with no hit returns 0; with sliding-window groups one token is left to
recompute; less than a chunk is 0.
update_state_after_alloc: one prepare_load over every group's keys (group
order, chunk order), dst GPULoadStoreSpec(ids from the first non-null block
at or after the locally computed ones, group_sizes, block_indices), job
pending on every rank; CHUNK_LEVEL marks loaded chunks stored.
build_connector_meta: on_schedule_end, jobs_to_flush for preempted requests'
stores, then per request one prepare_store of its new storable chunks (the
prompt only by default; chunks whose last block is null skipped): None ->
nothing, retried next step; else src = the stored chunks' non-null blocks
per group; then on_request_finished for finished requests.
update_connector_output: completion counts summed over ranks; at world_size,
complete_store / complete_load with that job's key SET (never success=False).
request_finished returns (False, None). reset_cache flushes jobs in flight
(they never complete), resets the manager, stores restart from chunk 0.
"""
import itertools

from vllm.distributed.kv_events import (MEDIUM_CPU, MEDIUM_STORAGE, BlockRemoved,
                                        BlockStored)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata, TransferJob)
from vllm.v1.kv_cache_interface import SlidingWindowSpec
from vllm.v1.kv_offload.base import (GPULoadStoreSpec, LookupResult, Medium, OffloadPolicy,
                                     ReqContext, ScheduleEndContext,
                                     get_offload_block_hash, get_offload_group_idx,
                                     make_offload_key)

_MEDIUMS = {Medium.CPU: MEDIUM_CPU, Medium.STORAGE: MEDIUM_STORAGE}


def cdiv(a, b):
    return -(-a // b)


class _Group:
    def __init__(self, position, config, spec, blocks_per_chunk, tokens_per_hash):
        self.position = position
        self.group_id = config.group_id
        self.tokens_per_block = config.tokens_per_block
        self.tokens_per_chunk = config.tokens_per_block * blocks_per_chunk
        self.hashes_per_chunk = self.tokens_per_chunk // tokens_per_hash
        window = getattr(spec, "sliding_window", 0) if isinstance(spec, SlidingWindowSpec) \
            else 0
        self.window_chunks = cdiv(window - 1, self.tokens_per_chunk) if window else None


class _ReqState:
    def __init__(self, request, ctx, groups):
        self.request = request
        self.ctx = ctx
        self.policy = None
        self.keys = [[] for _ in groups]
        self.block_ids = [[] for _ in groups]
        self.next_stored = [0 for _ in groups]
        self.transfer_jobs = set()
        self.finished = False


class _Job:
    def __init__(self, req_id, keys, is_store, pending, blocks=()):
        self.req_id = req_id
        self.keys = set(keys)
        self.is_store = is_store
        self.pending = pending
        self.blocks = set(blocks)  # a store's source blocks (its fence)


class OffloadingConnectorScheduler:
    def __init__(self, spec, kv_cache_config):
        self.spec = spec
        self.manager = spec.get_manager()
        self.f = spec.blocks_per_chunk
        self.world_size = spec.config.parallel.world_size
        specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
        self.groups = [_Group(i, c, specs[c.group_id], self.f, spec.tokens_per_hash)
                       for i, c in enumerate(spec.config.groups)]
        self.has_sw = any(g.window_chunks for g in self.groups)
        self._reqs = {}
        self._jobs = {}
        self._job_ids = itertools.count()
        self._stale_below = 0
        self._load_jobs = {}
        self._to_flush = set()
        self.flushed = 0  # store jobs sent in jobs_to_flush (for tests)

    # -- keys -----------------------------------------------------------------

    def _update_keys(self, st):
        hashes = st.request.block_hashes
        for g in self.groups:
            keys = st.keys[g.position]
            while (len(keys) + 1) * g.hashes_per_chunk <= len(hashes):
                h = hashes[(len(keys) + 1) * g.hashes_per_chunk - 1]
                key = make_offload_key(h, g.group_id)
                keys.append(key)
                st.ctx.set_offload_key_position(key, len(keys) * g.tokens_per_chunk)

    # -- requests ---------------------------------------------------------------

    def on_new_request(self, request):
        ctx = ReqContext(req_id=request.req_id,
                         kv_transfer_params=getattr(request, "kv_transfer_params", None))
        st = _ReqState(request, ctx, self.groups)
        st.policy = self.manager.on_new_request(ctx)
        self._reqs[request.req_id] = st

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        st = self._reqs[request.req_id]
        if st.transfer_jobs:
            return None, False
        self._update_keys(st)
        hits = self._lookup(st, num_computed_tokens)
        if hits is None:
            return None, False
        return hits, hits > 0

    def _lookup(self, st, num_computed):
        bound = len(st.request.prompt_token_ids)
        if self.has_sw:
            bound -= 1
        order = [g for g in self.groups if g.window_chunks is None] + sorted(
            (g for g in self.groups if g.window_chunks), key=lambda g: -g.window_chunks)
        end, defer = bound, False
        for g in order:
            tpc = g.tokens_per_chunk
            start = num_computed // tpc
            stop = min(bound // tpc, len(st.keys[g.position]))
            if stop <= start:
                return 0
            keys = st.keys[g.position][start:stop]
            got = (self._prefix(keys, st.ctx) if g.window_chunks is None
                   else self._window(keys, st.ctx, g.window_chunks))
            if got is None:
                defer = True
                continue
            if got == 0:
                return 0
            end = min(end, (start + got) * tpc)
        if defer:
            return None
        hits = end - num_computed
        return hits if hits >= min(g.tokens_per_chunk for g in self.groups) else 0

    def _result(self, key, ctx):
        r = self.manager.lookup(key, ctx)
        assert isinstance(r, LookupResult), f"lookup returned {r!r}"
        return r

    def _prefix(self, keys, ctx):
        n, defer, pending = 0, False, False
        for key in keys:
            r = self._result(key, ctx)
            if r is LookupResult.MISS:
                break
            if r is LookupResult.RETRY:
                defer = True
                continue
            n += 1
            pending = pending or r is LookupResult.HIT_PENDING
        if defer or (pending and self.spec.max_recompute_pending_tokens == 0):
            return None
        return n

    def _window(self, keys, ctx, window):
        streak, defer, pending = 0, False, False
        for i in range(len(keys) - 1, -1, -1):
            r = self._result(keys[i], ctx)
            if r is LookupResult.RETRY:
                defer, streak = True, 0
            elif r is LookupResult.MISS:
                streak = 0
            else:
                streak += 1
                pending = pending or r is LookupResult.HIT_PENDING
            if streak >= window:
                return None if defer or pending else i + window
        return None if defer or pending else streak

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        st = self._reqs[request.req_id]
        st.block_ids = [list(b) for b in blocks]
        if num_external_tokens == 0:
            return
        num_cached = request.num_computed_tokens + num_external_tokens
        local = request.num_computed_tokens
        ids, sizes, starts, keys = [], [], [], []
        for g in self.groups:
            gb = st.block_ids[g.position]
            n_gpu = cdiv(num_cached, g.tokens_per_block)
            first = cdiv(local, g.tokens_per_block)
            while first < n_gpu and gb[first] == 0:
                first += 1
            ids += gb[first:n_gpu]
            sizes.append(n_gpu - first)
            starts.append(first)
            if n_gpu > first:
                keys += st.keys[g.position][first // self.f:cdiv(num_cached, g.tokens_per_chunk)]
        src = self.manager.prepare_load(keys, st.ctx)
        job_id = next(self._job_ids)
        self._load_jobs[job_id] = TransferJob(request.req_id, src,
                                              GPULoadStoreSpec(ids, sizes, starts))
        self._jobs[job_id] = _Job(request.req_id, keys, False, self.world_size)
        st.transfer_jobs.add(job_id)
        if st.policy.policy is OffloadPolicy.CHUNK_LEVEL:
            for g in self.groups:
                st.next_stored[g.position] = max(st.next_stored[g.position],
                                                 num_cached // g.tokens_per_chunk)

    # -- each step ------------------------------------------------------------------

    def build_connector_meta(self, scheduled, finished_req_ids=(), preempted_req_ids=(),
                             new_req_ids=()):
        """scheduled: {req_id: block ids per group} of requests whose tokens
        were scheduled this step (num_computed_tokens already counts them)."""
        for req_id, blocks in scheduled.items():
            self._reqs[req_id].block_ids = [list(b) for b in blocks]
        self.manager.on_schedule_end(ScheduleEndContext(list(new_req_ids),
                                                        list(preempted_req_ids)))
        meta = OffloadingConnectorMetadata(load_jobs=self._load_jobs,
                                           jobs_to_flush=self._to_flush)
        self._load_jobs, self._to_flush = {}, set()
        for req_id in preempted_req_ids:
            st = self._reqs[req_id]
            for job_id in st.transfer_jobs:
                assert self._jobs[job_id].is_store, "a preempted request with a load"
                meta.jobs_to_flush.add(job_id)
        self.flushed += len(meta.jobs_to_flush)
        for req_id in list(scheduled) + [r for r in finished_req_ids if r not in scheduled]:
            if req_id in self._reqs:
                self._build_store_job(self._reqs[req_id], meta)
        for req_id in finished_req_ids:
            st = self._reqs.get(req_id)
            if st is not None and not st.finished:
                st.finished = True
                self.manager.on_request_finished(st.ctx)
                if not st.transfer_jobs:
                    del self._reqs[req_id]
        return meta

    def _build_store_job(self, st, meta):
        self._update_keys(st)
        request = st.request
        limit = request.num_computed_tokens
        if self.spec.offload_prompt_only:
            limit = min(limit, len(request.prompt_token_ids))
        keys, spans = [], []
        for g in self.groups:
            chunks = min(limit // g.tokens_per_chunk, len(st.keys[g.position]))
            cand = []
            for c in range(st.next_stored[g.position], chunks):
                last = (c + 1) * self.f - 1
                gb = st.block_ids[g.position]
                if last < len(gb) and gb[last] != 0:
                    cand.append(c)
            spans.append((g, cand, chunks))
            keys += [st.keys[g.position][c] for c in cand]
        if not keys:
            for g, _, chunks in spans:
                st.next_stored[g.position] = max(st.next_stored[g.position], chunks)
            return
        out = self.manager.prepare_store(keys, st.ctx)
        if out is None:
            return  # "cannot store chunks": the same chunks come back next step
        chosen = set(out.keys_to_store)
        assert chosen <= set(keys), "keys_to_store outside the keys given"
        ids, sizes, starts = [], [], []
        for g, cand, chunks in spans:
            st.next_stored[g.position] = max(st.next_stored[g.position], chunks)
            gb = st.block_ids[g.position]
            group_ids, first = [], None
            for c in cand:
                if st.keys[g.position][c] not in chosen:
                    continue
                for b in range(c * self.f, (c + 1) * self.f):
                    if gb[b] != 0:
                        group_ids.append(gb[b])
                        first = b if first is None else first
            ids += group_ids
            sizes.append(len(group_ids))
            starts.append(first or 0)
        if not chosen:
            return
        job_id = next(self._job_ids)
        meta.store_jobs[job_id] = TransferJob(request.req_id,
                                              GPULoadStoreSpec(ids, sizes, starts),
                                              out.store_spec)
        self._jobs[job_id] = _Job(request.req_id, out.keys_to_store, True, self.world_size,
                                  ids)
        st.transfer_jobs.add(job_id)

    def on_blocks_reallocated(self, block_ids):
        """The fence: store jobs whose source blocks were allocated again
        this step go into jobs_to_flush (the workers wait for them before
        the step's forward pass writes those blocks)."""
        ids = set(block_ids)
        for job_id, job in self._jobs.items():
            if job.is_store and job.blocks & ids:
                self._to_flush.add(job_id)

    def update_connector_output(self, worker_metas):
        counts = {}
        for m in worker_metas:
            if m is None:
                continue
            for job_id, n in m.completed_jobs.items():
                counts[job_id] = counts.get(job_id, 0) + n
        for job_id, n in sorted(counts.items()):
            if job_id < self._stale_below:
                continue
            job = self._jobs[job_id]
            assert n > 0
            job.pending -= n
            assert job.pending >= 0
            if job.pending:
                continue
            st = self._reqs[job.req_id]
            if job.is_store:
                self.manager.complete_store(job.keys, st.ctx)
            else:
                self.manager.complete_load(job.keys, st.ctx)
            del self._jobs[job_id]
            st.transfer_jobs.discard(job_id)
            if st.finished and not st.transfer_jobs:
                del self._reqs[job.req_id]

    def request_finished(self, request):
        if request.req_id not in self._reqs:
            ctx = ReqContext(req_id=request.req_id)
            self.manager.on_new_request(ctx)
            self.manager.on_request_finished(ctx)
        return False, None

    def has_pending_push_work(self):
        return bool(self._jobs) or self.manager.has_pending_work()

    def reset_cache(self):
        self._to_flush |= set(self._jobs)
        for req_id, st in list(self._reqs.items()):
            if st.finished:
                del self._reqs[req_id]
        self.manager.reset_cache()
        for st in self._reqs.values():
            st.next_stored = [0 for _ in self.groups]
            st.transfer_jobs.clear()
        self._stale_below = next(self._job_ids)
        self._jobs.clear()

    def take_events(self):
        for event in self.manager.take_events():
            medium = _MEDIUMS[event.medium]  # KeyError for any other medium
            if event.removed:
                by_group = {}
                for key in event.keys:
                    by_group.setdefault(get_offload_group_idx(key), []).append(
                        get_offload_block_hash(key))
                for gid, hashes in by_group.items():
                    yield BlockRemoved(hashes, medium, gid)
            else:
                for key in event.keys:
                    yield BlockStored([get_offload_block_hash(key)], None, [], 0, None, medium,
                                      get_offload_group_idx(key))

    def shutdown(self):
        self.manager.shutdown()
