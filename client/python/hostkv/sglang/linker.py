"""HostkvLinker: SGLang main's UnifiedCacheLinker (the unified radix cache's
external linker, python/sglang/srt/mem_cache/unified_cache/
unified_cache_linker.py) on hostkvd. hostkvd copies pages straight between
its pool and the engine's device KV buffers, layer by layer: the engine
keeps no host pool at all.

    python -m sglang.launch_server --model-path MODEL \\
      --enable-unified-cache-external-linker \\
      --unified-cache-external-linker-config '{"linker": "HostkvLinker",
        "linker_module_path": "hostkv.sglang.linker",
        "linker_extra_config": {"hostkv_capacity_bytes": 17179869184}}'

SGLang's calls, and what each does here (one hostkv session per rank for
lookups and loads, one more for offloads, on a thread of its own):
  lookup(rid, transfers)    Lookup(acquire) of the KV transfer's page hashes
                            in this rank's namespace: every prefix length up
                            to the pages found (a contiguous prefix). The
                            references are this rid's lease, so no engine's
                            allocation evicts the pages before the load; a
                            new lookup for the rid replaces it. While
                            hostkvd is away: [] (a miss), at once.
  load(rid, transfers)      queues the (possibly trimmed) pages of the lease
                            for their device slots.
  start_layer_wise_loading  one Load of every queued page (-1 when none);
                            its consumer index. The forward pass's
                            layer_done_counter.wait_until(layer) waits for
                            that layer only: on CUDA on the current stream
                            (hostkv's GPU signal words, no CPU thread
                            blocks), on the CPU backend on the host.
  num_completed_loads / pop_completed_load   a batch is complete when its
                            Load ended; its lease is released then.
  cancel_queued_load(rid)   True (and the lease released) for a load queued
                            and not started; else False, releasing a lease
                            its lookup left.
  offload(transfers)        Alloc, Backup of the device slots (after the
                            stream's KV-written mark on CUDA), Publish under
                            the page hashes; the result (True: stored or
                            cached already) in completion order.
  reset / close             wait for what runs, give every lease back
                            (close: and end the sessions).
Options (linker_extra_config): hostkv_target, hostkv_namespace (extra text
for the namespace), hostkv_pool_prefix ("sglang"), hostkv_capacity_bytes
(the rank's pool, default 1 GiB; a pool another engine made keeps its size),
tp_rank / tp_size (else SGLang's get_parallel() attn TP ranks).
"""
import collections
import itertools
import logging
import threading
import time

from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker

from .. import errors
from .._pace import Pace
from .. import torch as hostkv_torch
from ..cache_calls import page_list, page_runs
from ..client import Client
from .linker_offloads import OffloadQueue
from .linker_pool import DeviceKv, Placement, page_key
from .transfer_submitter import Pending, TransferSubmitter
from .transfer_sync import sync_for

logger = logging.getLogger("hostkv.sglang")

DEFAULT_CAPACITY_BYTES = 1 << 30
LEASE_SECONDS = 2.0  # a lookup's references that no load claimed go after this
PROBE_SECONDS = 0.5
RECONNECT_SECONDS = 5.0


def _kv_transfer(transfers):
    """The KV transfer of a list (SGLang's PoolName.KV), or None when there
    is another pool this linker cannot restore (then nothing is)."""
    kv = None
    for t in transfers:
        name = str(getattr(t.name, "value", t.name)).lower()
        if name == "kv":
            kv = t
        else:
            return None
    return kv


def _rank(extra):
    if "tp_rank" in extra:
        return int(extra["tp_rank"]), int(extra.get("tp_size", 1))
    try:
        from sglang.srt.runtime_context import \
            get_parallel  # pylint: disable=import-outside-toplevel
        p = get_parallel()
        return int(getattr(p, "attn_tp_rank", p.tp_rank)), int(getattr(p, "attn_tp_size",
                                                                        p.tp_size))
    except (ImportError, AttributeError):
        return 0, 1


class LayerCounter:
    """SGLang's layer_done_counter: set_consumer(index) before each forward,
    wait_until(layer) before a layer's buffers are read (any number of
    times; index -1 or unknown: nothing to wait for). A plain attribute, as
    SGLang's own counters: the TP worker may set it on another thread than
    the one whose pool getters wait."""

    def __init__(self, linker):
        self._linker = linker
        self._index = -1

    def set_consumer(self, index):
        self._index = int(index)

    def wait_until(self, layer):
        index = self._index
        if index < 0:
            return
        self._linker.wait_layer(index, int(layer))


class _Batch:
    __slots__ = ("index", "rids", "pending", "leases", "sync", "client")

    def __init__(self, index, rids, pending, leases, sync=None, client=None):
        self.index, self.rids, self.pending, self.leases = index, rids, pending, leases
        self.sync, self.client = sync, client  # the session's, at submission


class HostkvLinker(UnifiedCacheLinker):
    def __init__(self, server_args, params, *, components=None, extra_config=None):
        extra = dict(extra_config or {})
        names = {str(getattr(c, "name", c)).upper() for c in (components or ())}
        if names - {"FULL"}:
            raise ValueError(
                f"HostkvLinker restores full-attention KV only; this cache also has "
                f"{sorted(names - {'FULL'})} components")
        kvcache = params.token_to_kv_pool_allocator.get_kvcache()
        self._kv = DeviceKv(kvcache, params.page_size)
        rank, tp_size = _rank(extra)
        model = getattr(server_args, "model_path", None) or getattr(server_args, "model",
                                                                    "model")
        self._place = Placement(model, self._kv, tp_size, rank,
                                extra=str(extra.get("hostkv_namespace", "")),
                                pool_prefix=str(extra.get("hostkv_pool_prefix", "sglang")))
        self._target = extra.get("hostkv_target") or None
        capacity = int(extra.get("hostkv_capacity_bytes", DEFAULT_CAPACITY_BYTES))
        self._capacity = capacity
        self._client_name = f"sglang-linker-r{rank}"
        self._probes, self._reconnects = Pace(PROBE_SECONDS), Pace(RECONNECT_SECONDS)
        self._client = Client(self._target, client_name=self._client_name)
        try:
            self._import_id, self._sync = self._register(self._client)
            self._offloads = OffloadQueue(
                lambda: Client(self._target, client_name=f"sglang-offload-r{rank}"),
                self._place, self._kv, self._register)
        except BaseException:
            self._client.close()
            raise
        self._submitter = TransferSubmitter(self._sync.asynchronous, "hostkv-linker")
        self._lock = threading.Lock()
        self._leases = {}      # rid -> (when, {page key: page}), from lookup
        self._unreleased = []  # pages whose release hostkvd did not take (away)
        self._queued = []      # [(rid, pages, device slots)] for the next start
        self._loading = collections.deque()  # _Batch in start order
        self._by_index = {}    # consumer index -> _Batch
        self._done = collections.deque()     # rid lists of completed batches
        self._indices = itertools.count()
        self.layer_done_counter = LayerCounter(self)
        logger.info("hostkv linker rank %d/%d: pool %s, namespace %s", rank, tp_size,
                    self._place.pool, self._place.namespace)

    # -- setup ---------------------------------------------------------------

    def _attach_pool(self, client):
        spec = self._kv.pool_spec(self._place.pool, self._capacity)
        try:
            client.create_pool(spec, attach_if_exists=True)
        except errors.AlreadyExists:
            have = client.get_pool(self._place.pool).spec
            if (have.geometry, have.page_size) != (spec.geometry, spec.page_size):
                raise
            logger.info("pool %s exists with another capacity; using it as it is",
                        self._place.pool)

    def _register(self, client):
        """Attaches the pool and registers the device KV buffers with
        `client`'s session: (import id, the waits for transfers on them)."""
        self._attach_pool(client)
        planes = [[hostkv_torch.describe(client, t) for t in plane]
                  for plane in self._kv.planes]
        sync = sync_for(client, self._kv.planes[0][0], self._kv.layers)
        import_id = client.register_device_buffers(
            self._place.pool, self._kv.rows, planes[0], planes[1] if len(planes) > 1 else (),
            gpu_signals=sync.gpu_signals())
        sync.attach(import_id)
        return import_id, sync

    # -- lookups and loads (the scheduler thread) ------------------------------

    def _daemon_answers(self):
        """False while hostkvd is away (asked again at most every
        PROBE_SECONDS, never waited for); a new session once it answers
        without this one (it lost its state: the leases went with it)."""
        c = self._client
        if c.session_lost:
            return self._reconnect()
        if not c.daemon_away:
            self._release_unreleased()
            return True
        if not self._probes.due():
            return False
        try:
            return c.probe()
        except errors.SessionLost:
            return self._reconnect()

    def _reconnect(self):
        if not self._reconnects.due():
            return False
        try:
            client = Client(self._target, client_name=self._client_name)
            try:
                import_id, sync = self._register(client)
            except BaseException:
                client.close()
                raise
        except errors.HostKVError as e:
            logger.warning("no new hostkv session for the linker yet: %s", e)
            return False
        with self._lock:
            # Pages of the lost session went with it: loads not done yet can
            # copy nothing; they are reported in order, and their waits raise.
            self._queued = [(rid, [], slots, max(1, missing))
                            for rid, _, slots, missing in self._queued]
            for batch in self._loading:
                if batch.pending is not None:
                    batch.pending = _Broken("hostkvd lost the session before the load ended")
                batch.leases = []
            self._leases = {}
        self._unreleased = []
        old, self._client = self._client, client
        self._import_id, self._sync = import_id, sync
        old.close()
        logger.warning("hostkvd lost the linker's session (rank %d); a new one is open",
                       self._place.rank)
        return True

    def lookup(self, rid, transfers):
        answers = self._daemon_answers()
        self._drop_lease(rid)
        self._expire_leases()
        kv = _kv_transfer(transfers)
        if kv is None or not kv.keys or not answers:
            return []
        keys = [page_key(k) for k in kv.keys]
        try:
            found = self._client.lookup(self._place.pool, self._place.namespace, keys,
                                        acquire=True, wait=False)
        except errors.HostKVError as e:
            logger.warning("lookup of %d pages for %s: %s %s; a miss", len(keys), rid,
                           e.code_name, e.message)
            return []
        if not found.hits:
            return []
        pages = page_list(found.pages)
        with self._lock:
            self._leases[rid] = (time.monotonic(), dict(zip(keys, pages)))
        return list(range(1, found.hits + 1))

    def load(self, rid, transfers):
        kv = _kv_transfer(transfers)
        with self._lock:
            lease = self._leases.pop(rid, (0, {}))[1]
        if kv is None or not kv.keys:
            self._release_pages(list(lease.values()))
            return True  # nothing of ours to load: an empty batch entry
        keys = [page_key(k) for k in kv.keys]
        ps = self._kv.page_size
        count = int(kv.device_indices.numel())
        if count != len(keys) * ps:
            self._release_pages(list(lease.values()))
            raise errors.InvalidArgument(
                f"load {rid}: {count} device slots for {len(keys)} pages of {ps}")
        # A CUDA index tensor reaches the host by a copy on the current
        # stream that only the submission waits for (never this thread).
        slots = self._sync.host_indices(kv.device_indices)
        missing = [k for k in keys if k not in lease]
        if missing:
            # Not from this rid's lookup (SGLang trims, never extends): the
            # pages cannot be promised; the load's waits will raise.
            logger.error("load %s: %d of %d pages were not found by its lookup", rid,
                         len(missing), len(keys))
        pages = [lease.pop(k) for k in keys if k in lease]
        self._release_pages(list(lease.values()))  # found but trimmed away
        with self._lock:
            self._queued.append((rid, pages, slots, len(missing)))
        return True

    def start_layer_wise_loading(self):
        with self._lock:
            queued, self._queued = self._queued, []
        if not queued:
            return -1
        index = next(self._indices)
        pages = [p for _, ps, _, _ in queued for p in ps]
        slots = [ss for _, _, ss, _ in queued]
        rids = [rid for rid, _, _, _ in queued]
        broken = sum(m for _, _, _, m in queued)
        pending = self._submit_load(pages, slots) if pages and not broken else None
        batch = _Batch(index, rids, pending, pages, self._sync, self._client)
        if broken:
            batch.pending = _Broken(f"{broken} pages of the batch were not in hostkvd (not "
                                    "found by the lookup, or the session was lost)")
        with self._lock:
            self._loading.append(batch)
            self._by_index[index] = batch
        return index

    def _submit_load(self, pages, slots):
        """slots: the requests' device indices (host_indices objects)."""
        sync, client, import_id = self._sync, self._client, self._import_id
        host = page_runs(pages)
        # The slots may still be written by work queued on the current
        # stream (CUDA): the daemon's copy waits for this mark.
        mark = sync.mark_kv_written()
        value = sync.signal_value()
        pending = Pending(0, self._kv.layers, value)

        def call():
            try:
                device = page_runs([int(s) for obj in slots for s in obj.get().tolist()])
                gpu = {"signal_value": value, "gpu_waits_only": True} if value else {}
                return client.load(self._place.pool, import_id, host, device,
                                   wait_kv_written=mark, **gpu)
            except BaseException:
                # No copy will signal `value`: let the streams waiting for it
                # go on (the waits then raise on the host).
                sync.failed(pending)
                raise

        pending.future = self._submitter.submit(call)
        return pending

    def wait_layer(self, index, layer):
        """layer_done_counter.wait_until: layer `layer` of batch `index` is
        in place (CUDA: the current stream waits for it). RuntimeError for a
        batch whose pages could not be loaded (never stale KV)."""
        with self._lock:
            batch = self._by_index.get(index)
        if batch is None or batch.pending is None:
            return
        if isinstance(batch.pending, _Broken):
            raise RuntimeError(f"hostkv load batch {index}: {batch.pending.reason}")
        if not 0 <= layer < self._kv.layers:
            return
        if batch.sync.asynchronous:
            try:
                batch.pending.operation(0)
            except TimeoutError:
                pass  # not submitted yet: the stream wait covers it
            except Exception as e:  # pylint: disable=broad-except
                raise RuntimeError(f"hostkv load batch {index} was not submitted: {e}") from e
        batch.sync.wait_layer(batch.pending, layer)

    def cancel_queued_load(self, rid):
        """False always: a load SGLang queued has adopted its tree nodes, and
        a True would unlock them unfilled (SGLang's own linkers answer False
        too). A queued load runs with the next batch and is reported as
        usual; a lease its lookup left is given back."""
        self._drop_lease(rid)
        return False

    def num_completed_loads(self):
        self._expire_leases()
        while True:
            with self._lock:
                batch = self._loading[0] if self._loading else None
            if batch is None or not self._ended(batch):
                break
            with self._lock:
                self._loading.popleft()
                self._by_index.pop(batch.index, None)
                self._done.append(batch.rids)
            self._release_pages(batch.leases)
        with self._lock:
            return len(self._done)

    def pop_completed_load(self):
        with self._lock:
            return self._done.popleft()

    def _ended(self, batch, timeout=0):
        if batch.pending is None or isinstance(batch.pending, _Broken):
            return True
        try:
            op = batch.pending.operation(timeout)
            batch.client.wait(op, timeout=timeout if timeout is not None else 600.0)
            return True
        except (errors.DeadlineExceeded, TimeoutError):
            return False
        except Exception as e:  # pylint: disable=broad-except
            logger.error("load batch %d: %s", batch.index, e)
            return True

    # -- offloads ----------------------------------------------------------------

    def offload(self, transfers):
        kv = _kv_transfer(transfers)
        if kv is None or not kv.keys:
            return False
        return self._offloads.put([page_key(k) for k in kv.keys], kv.device_indices)

    def num_completed_offloads(self):
        return self._offloads.completed()

    def pop_completed_offload(self):
        return self._offloads.pop()

    # -- reset, close ----------------------------------------------------------

    def reset(self):
        self._quiesce()
        self._offloads.reset()

    def close(self):
        self._quiesce()
        self._offloads.close()
        self._submitter.close()
        self._client.close()

    def _quiesce(self):
        with self._lock:
            queued, self._queued = self._queued, []
            loading = list(self._loading)
            self._loading.clear()
            self._by_index.clear()
            self._done.clear()
            leases, self._leases = [lease for _, lease in self._leases.values()], {}
        for batch in loading:
            self._ended(batch, timeout=None)
            self._release_pages(batch.leases)
        for entry in queued:
            self._release_pages(entry[1])
        for lease in leases:
            self._release_pages(list(lease.values()))

    def _drop_lease(self, rid):
        with self._lock:
            lease = self._leases.pop(rid, None)
        if lease:
            self._release_pages(list(lease[1].values()))

    def _expire_leases(self):
        """SGLang looks up and loads in one scheduling pass, and calls
        nothing when the ranks agree on less than this one found or the
        request leaves: leases older than LEASE_SECONDS go."""
        now = time.monotonic()
        with self._lock:
            old = [rid for rid, (t, _) in self._leases.items() if now - t > LEASE_SECONDS]
            leases = [self._leases.pop(rid)[1] for rid in old]
        for lease in leases:
            self._release_pages(list(lease.values()))

    def _release_pages(self, pages):
        """Gives references back without waiting for an absent daemon; what
        it did not take is given back once it answers (never forgotten: the
        client would take those references again at a resume)."""
        if not pages:
            return
        if self._client.daemon_away:
            self._unreleased.extend(pages)
            return
        try:
            self._client.release(self._place.pool, page_runs(sorted(pages)), wait=False)
        except errors.FailedPrecondition:
            for page in pages:  # all or nothing: those still held, one by one
                try:
                    self._client.release(self._place.pool, [(page, 1)], wait=False)
                except errors.FailedPrecondition:
                    pass
                except errors.HostKVError:
                    self._unreleased.append(page)
        except errors.HostKVError as e:
            logger.warning("releasing %d pages: %s; again once hostkvd answers", len(pages), e)
            self._unreleased.extend(pages)

    def _release_unreleased(self):
        if self._unreleased and not self._client.daemon_away:
            pages, self._unreleased = self._unreleased, []
            self._release_pages(pages)


class _Broken:
    """A batch whose pages could not all be found: nothing was copied."""

    def __init__(self, reason):
        self.reason = reason
