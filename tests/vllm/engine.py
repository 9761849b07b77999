"""A vLLM v0.26+ instance in miniature, on the stand-in (standin/vllm): the
engine loop that drives the offloading connector's scheduler and one worker
per rank in vLLM's call order, with KV caches in shared memory (the CPU
backend's "device" memory) whose bytes are a known function of each block's
tokens, so that every loaded block can be checked byte for byte.

Per step (vLLM's EngineCore.step with the OffloadingConnector):
  schedule   waiting requests: get_num_new_matched_tokens (None: deferred,
             asked again next step); blocks allocated per group (fresh blocks
             are filled with 0xEE, so a load that did not arrive shows);
             sliding-window groups get the null block 0 below their window;
             update_state_after_alloc. A request with external hits waits
             for its load (finished_recving on every rank), then computes the
             rest of its prompt. Blocks freed by finished requests that are
             allocated again fence their store jobs (jobs_to_flush).
  connector  build_connector_meta -> per rank: handle_preemptions,
             start_kv_transfers, the forward pass (the scheduled tokens'
             blocks written), prepare_store_kv (stores deferred to the next
             step), get_finished, build_connector_worker_meta ->
             update_connector_output; take_events when events are on.
A request computes its whole prompt in one step and finishes the step
after. Checked: every loaded block's bytes, before the forward pass writes
anything (Instance.loaded_blocks counts them).
"""
import hashlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "standin")
if STANDIN not in sys.path:
    sys.path.insert(0, STANDIN)

import torch  # noqa: E402

import hostkv.torch as hkt  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (  # noqa: E402
    build_offloading_config)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (  # noqa: E402
    OffloadingConnectorScheduler, cdiv)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (  # noqa: E402
    OffloadingConnectorWorker)
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, KVCacheTensor, SlidingWindowSpec)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402

NOISE = 0xEE
MAX_SECONDS = 120  # a run that makes no progress for this long fails


class Parallel:
    def __init__(self, tp=1, pp=1, rank=0, dp_index=0, dp_size=1):
        self.tp, self.pp, self.rank = tp, pp, rank
        self.dp_index, self.dp_size = dp_index, dp_size


class EngineConfig:
    """What build_offloading_config reads of vLLM's config."""

    def __init__(self, model, dtype, extra, parallel, events, engine_id, hash_block_size):
        self.model, self.dtype, self.extra_config = model, dtype, extra
        self.parallel, self.enable_kv_cache_events = parallel, events
        self.engine_id, self.hash_block_size = engine_id, hash_block_size


def full(block=16, heads=2, head_size=16, dtype=torch.float16):
    return FullAttentionSpec(block, heads, head_size, dtype)


def sliding(window, block=16, heads=2, head_size=16, dtype=torch.float16):
    return SlidingWindowSpec(block, heads, head_size, dtype, sliding_window=window)


class Request:
    def __init__(self, req_id, tokens, tokens_per_hash, seed=b"hostkv-test"):
        self.req_id = req_id
        self.prompt_token_ids = list(tokens)
        self.num_computed_tokens = 0
        self.kv_transfer_params = None
        self.block_hashes, parent = [], hashlib.sha256(seed).digest()
        for i in range(len(tokens) // tokens_per_hash):
            chunk = tokens[i * tokens_per_hash:(i + 1) * tokens_per_hash]
            parent = hashlib.sha256(parent + repr(chunk).encode()).digest()
            self.block_hashes.append(parent)


def prompt(n_tokens, first=1000):
    return list(range(first, first + n_tokens))


class Instance:
    """One vLLM engine: the scheduler's connector and one worker per rank
    (tp x pp ranks), each with its own spec and hostkv session."""

    def __init__(self, target, group_specs, layers=2, num_blocks=64, tp=1, model="org/m",
                 extra=None, events=True, engine_id="engine-0", dp_index=0, dp_size=1,
                 tokens_per_hash=16):
        self.group_specs = list(group_specs)
        self.layers = layers
        self.tp = tp
        self.tokens_per_hash = tokens_per_hash
        names = [[f"model.layers.{li}.g{g}.attn" for li in range(layers)]
                 for g in range(len(group_specs))]
        self.names = names
        # vLLM's hybrid allocator: one tensor per layer index shared by the
        # groups of one page size (their blocks come from one block pool).
        pages = sorted({s.page_size_bytes for s in group_specs})
        self.tensor_of = {}  # layer name -> (page, layer index)
        tensors = []
        for page in pages:
            share = [g for g, s in enumerate(group_specs) if s.page_size_bytes == page]
            for li in range(layers):
                tensors.append(KVCacheTensor(num_blocks * page,
                                             [names[g][li] for g in share]))
                for g in share:
                    self.tensor_of[names[g][li]] = (page, li)
        self.kcc = KVCacheConfig(num_blocks, tensors,
                                 [KVCacheGroupSpec(names[g], s)
                                  for g, s in enumerate(group_specs)])
        options = {"spec_name": "HostkvOffloadingSpec", "spec_module_path": "hostkv.vllm",
                   "hostkv_target": target, "cpu_bytes_to_use": 8 << 20}
        options.update(extra or {})
        self.events_on = events

        def config(rank):
            return EngineConfig(model, "float16", options, Parallel(tp=tp, rank=rank,
                                                                     dp_index=dp_index,
                                                                     dp_size=dp_size),
                                events, engine_id, tokens_per_hash)

        sched_config = build_offloading_config(config(0), self.kcc)
        self.sched = OffloadingConnectorScheduler(
            OffloadingSpecFactory.create_spec(sched_config), self.kcc)
        self.caches, self.workers = [], []
        for rank in range(tp):
            caches = self._allocate_caches(num_blocks)
            worker = OffloadingConnectorWorker(
                OffloadingSpecFactory.create_spec(build_offloading_config(config(rank),
                                                                          self.kcc)),
                self.kcc)
            worker.register_kv_caches(caches)
            self.caches.append(caches)
            self.workers.append(worker)
        self.free = list(range(1, num_blocks))  # block 0: the null block
        self.owner = {}                           # block -> req_id of a finished request
        self.events = []
        self.loaded_blocks = 0
        self.steps = 0
        self.unfinished = None

    def _allocate_caches(self, num_blocks):
        by_tensor, caches = {}, {}
        for name, (page, li) in self.tensor_of.items():
            t = by_tensor.get((page, li))
            if t is None:
                t = hkt.shm_tensor((num_blocks, page // 2), torch.float16)
                t.view(torch.uint8).fill_(NOISE)
                by_tensor[(page, li)] = t
            caches[name] = t
        return caches

    # -- the known bytes ----------------------------------------------------------

    def expected(self, rank, group, layer, request, block):
        """The bytes block `block` of `group` holds for `request`: a function
        of its tokens (up to the block's end), the rank and the layer."""
        spec = self.group_specs[group]
        end = min((block + 1) * spec.block_size, len(request.prompt_token_ids))
        digest = hashlib.sha256(repr((request.prompt_token_ids[:end], rank, group, layer))
                                .encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        return torch.randint(0, 256, (spec.page_size_bytes,), generator=gen,
                             dtype=torch.uint8)

    def _row(self, rank, group, layer, block):
        return self.caches[rank][self.names[group][layer]].view(torch.uint8)[block]

    def _write(self, request, blocks, start_token, end_token):
        for g, spec in enumerate(self.group_specs):
            for b in range(start_token // spec.block_size, cdiv(end_token, spec.block_size)):
                bid = blocks[g][b]
                if bid == 0:
                    continue
                for rank in range(self.tp):
                    for li in range(self.layers):
                        self._row(rank, g, li, bid).copy_(
                            self.expected(rank, g, li, request, b))

    def _check_loaded(self, request, blocks, hits):
        for g, spec in enumerate(self.group_specs):
            for b in range(cdiv(hits, spec.block_size)):
                bid = blocks[g][b]
                if bid == 0:
                    continue
                for rank in range(self.tp):
                    for li in range(self.layers):
                        got = self._row(rank, g, li, bid)
                        want = self.expected(rank, g, li, request, b)
                        if not torch.equal(got, want):
                            raise AssertionError(
                                f"{request.req_id}: block {b} of group {g} (GPU block {bid}), "
                                f"rank {rank}, layer {li} is not the bytes stored "
                                f"({int((got != want).sum())} bytes differ)")
                self.loaded_blocks += 1

    # -- allocation -----------------------------------------------------------------

    def _allocate(self, request, cached):
        n = len(request.prompt_token_ids)
        blocks, fresh = [], []
        for spec in self.group_specs:
            window = getattr(spec, "sliding_window", 0)
            ids = []
            below = cached // spec.block_size - cdiv(window - 1, spec.block_size) \
                if window else 0
            for b in range(cdiv(n, spec.block_size)):
                if b < below:
                    ids.append(0)  # below the window of what is loaded: never read
                    continue
                if not self.free:
                    raise RuntimeError("out of GPU blocks")
                bid = self.free.pop(0)
                ids.append(bid)
                fresh.append(bid)
            blocks.append(ids)
        # Reused blocks: fence the store jobs still reading them, then scribble.
        self.sched.on_blocks_reallocated([b for b in fresh if b in self.owner])
        for b in fresh:
            self.owner.pop(b, None)
        return blocks, fresh

    def _scribble(self, block_ids):
        if not block_ids:
            return
        ids = torch.tensor(block_ids, dtype=torch.long)
        for rank in range(self.tp):
            for name in self.caches[rank]:
                # index_fill_ writes in place (a [ids] index would fill a copy)
                self.caches[rank][name].view(torch.uint8).index_fill_(0, ids, NOISE)

    # -- the loop ---------------------------------------------------------------------

    def run(self, requests, reset_after=None, before_transfers=None, max_steps=None):
        """Runs the requests to completion; returns {req_id: external hit
        tokens}. before_transfers(instance, meta): called each step before
        the workers see the metadata. max_steps: stop after that many steps
        of this call (self.unfinished then names what was left)."""
        first_step = self.steps
        import time  # pylint: disable=import-outside-toplevel
        deadline = time.monotonic() + MAX_SECONDS
        waiting = list(requests)
        seen, hits_of, blocks_of = set(), {}, {}
        loading = {}      # req_id -> ranks still to report
        ready = []        # loads done: compute the rest next step
        done_prefill = []  # finish next step
        while waiting or loading or ready or done_prefill or \
                self.sched.has_pending_push_work():
            self.steps += 1
            if max_steps is not None and self.steps - first_step > max_steps:
                self.unfinished = {"waiting": [r.req_id for r in waiting],
                                   "loading": list(loading)}
                return hits_of
            if time.monotonic() > deadline:
                raise AssertionError(f"not done after {MAX_SECONDS} s: waiting "
                                     f"{[r.req_id for r in waiting]}, loading {list(loading)}")
            finished, new_ids, scheduled, to_scribble = [], [], {}, []
            for r in done_prefill:
                finished.append(r.req_id)
                for g in blocks_of[r.req_id]:
                    for b in g:
                        if b:
                            self.owner[b] = r.req_id
                            self.free.append(b)
                self.sched.request_finished(r)
            done_prefill = []
            for r in ready:
                self._check_loaded(r, blocks_of[r.req_id], hits_of[r.req_id])
                r.num_computed_tokens = len(r.prompt_token_ids)
                scheduled[r.req_id] = (r, hits_of[r.req_id])
            ready = []
            for r in list(waiting):
                if r.req_id not in seen:
                    seen.add(r.req_id)
                    new_ids.append(r.req_id)
                    self.sched.on_new_request(r)
                hits, _ = self.sched.get_num_new_matched_tokens(r, 0)
                if hits is None:
                    continue
                need = sum(cdiv(len(r.prompt_token_ids), s.block_size)
                           for s in self.group_specs)
                if need > len(self.free):
                    continue  # no room this step: it waits, as in vLLM
                waiting.remove(r)
                blocks, fresh = self._allocate(r, hits)
                to_scribble += fresh
                blocks_of[r.req_id], hits_of[r.req_id] = blocks, hits
                self.sched.update_state_after_alloc(r, blocks, hits)
                if hits:
                    loading[r.req_id] = self.tp
                else:
                    r.num_computed_tokens = len(r.prompt_token_ids)
                    scheduled[r.req_id] = (r, 0)
            meta = self.sched.build_connector_meta(
                {rid: blocks_of[rid] for rid in scheduled}, finished_req_ids=finished,
                new_req_ids=new_ids)
            if before_transfers is not None:
                before_transfers(self, meta)
            metas = []
            for w in self.workers:
                w.handle_preemptions(meta)
            self._scribble(to_scribble)  # fenced: the forward pass may reuse them now
            for w in self.workers:
                w.start_kv_transfers(meta)
            for rid, (r, start) in scheduled.items():
                self._write(r, blocks_of[rid], start, len(r.prompt_token_ids))
                done_prefill.append(r)
            for w in self.workers:
                w.prepare_store_kv(meta)
                _, recving = w.get_finished(set(finished))
                for rid in recving:
                    loading[rid] -= 1
                    if loading[rid] == 0:
                        del loading[rid]
                        ready.append(next(r for r in requests if r.req_id == rid))
                metas.append(w.build_connector_worker_meta())
            self.sched.update_connector_output(metas)
            if self.events_on:
                self.events += list(self.sched.take_events())
            if reset_after is not None and self.steps == reset_after:
                self.sched.reset_cache()
            if not (scheduled or ready or done_prefill):
                time.sleep(0.002)  # an idle step (vLLM's engine steps on while work is pending)
        return hits_of

    def close(self):
        for w in self.workers:
            w.shutdown()
        self.sched.shutdown()
