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
A sliding-window model (SGLang's SWAKVPool) has two parts, "kv" and "swa",
each with its own pool, namespace and registration (linker_parts.py): a
length is restorable when its KV pages and the window ending there are
cached; the layer counter's global layer ids go through layers_mapping.
Options (linker_extra_config): hostkv_target, hostkv_namespace (extra text
for the namespace), hostkv_pool_prefix ("sglang"), hostkv_capacity_bytes
(the rank's pools, default 1 GiB; a pool another engine made keeps its
size), hostkv_swa_capacity_bytes (the window pool's; else a share of the
capacity by page bytes), tp_rank / tp_size (else SGLang's get_parallel()
attn TP ranks).
"""
import collections
import itertools
import logging
import threading
import time

from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker

from .. import errors
from .._owned_names import owner_prefix
from .._pace import Pace
from ..cache_calls import page_list, page_runs
from ..client import Client
from .linker_offloads import OffloadQueue
from .linker_parts import KV, SWA, build_parts, register_all
from .linker_pool import page_key
from .transfer_submitter import Pending, TransferSubmitter

logger = logging.getLogger("hostkv.sglang")

DEFAULT_CAPACITY_BYTES = 1 << 30
LEASE_SECONDS = 2.0  # a lookup's references that no load claimed go after this
PROBE_SECONDS = 0.5
RECONNECT_SECONDS = 5.0
WINDOW_PROBES = 4  # Lookups of sliding windows per lookup(), at most


def _by_part(transfers, parts):
    """{part name: transfer} of SGLang's PoolTransfers, or None when one is
    for a pool this linker cannot restore (then nothing is)."""
    found = {}
    for t in transfers:
        name = str(getattr(t.name, "value", t.name)).lower()
        if name not in parts:
            return None
        found[name] = t
    return found if KV in found else None


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
    __slots__ = ("index", "rids", "pending", "leases", "imports", "client")

    def __init__(self, index, rids, pending, leases, imports=None, client=None):
        # pending: {part: Pending}, a _Broken, or None (nothing to copy);
        # leases: {part: pages} given back when it ends.
        self.index, self.rids, self.pending, self.leases = index, rids, pending, leases
        self.imports, self.client = imports, client  # the session's, at submission


class HostkvLinker(UnifiedCacheLinker):
    def __init__(self, server_args, params, *, components=None, extra_config=None):
        extra = dict(extra_config or {})
        names = {str(getattr(c, "name", c)).upper() for c in (components or ())}
        if names - {"FULL", "SWA"}:
            raise ValueError(
                f"HostkvLinker restores full-attention and sliding-window KV; this cache "
                f"also has {sorted(names - {'FULL', 'SWA'})} components")
        kvcache = params.token_to_kv_pool_allocator.get_kvcache()
        rank, tp_size = _rank(extra)
        model = getattr(server_args, "model_path", None) or getattr(server_args, "model",
                                                                    "model")
        capacity = int(extra.get("hostkv_capacity_bytes", DEFAULT_CAPACITY_BYTES))
        swa_capacity = extra.get("hostkv_swa_capacity_bytes")
        self._target = extra.get("hostkv_target") or None
        self._parts, self._route = build_parts(
            kvcache, params.page_size, model, tp_size, rank,
            str(extra.get("hostkv_namespace", "")),
            str(extra.get("hostkv_pool_prefix", "sglang")), capacity,
            None if swa_capacity is None else int(swa_capacity),
            owner_prefix(self._target, bool(extra.get("hostkv_shared_names", False))))
        self._page_size = int(params.page_size)
        self._window_pages = 0
        if SWA in self._parts:
            window = getattr(params, "sliding_window_size", None)
            if not window or int(window) <= 0:
                raise ValueError("a sliding-window pool without params.sliding_window_size")
            self._window_pages = -(-int(window) // self._page_size)
        elif "SWA" in names:
            raise ValueError(f"an SWA component over {type(kvcache).__name__}, which has no "
                             "sliding-window pool (swa_kv_pool)")
        self._rank = rank
        self._client_name = f"sglang-linker-r{rank}"
        self._probes, self._reconnects = Pace(PROBE_SECONDS), Pace(RECONNECT_SECONDS)
        self._client = Client(self._target, client_name=self._client_name)
        try:
            self._imports = register_all(self._parts, self._client)
            self._offloads = OffloadQueue(
                lambda: Client(self._target, client_name=f"sglang-offload-r{rank}"),
                self._parts)
        except BaseException:
            self._client.close()
            raise
        asynchronous = self._imports[KV].sync.asynchronous
        self._submitter = TransferSubmitter(asynchronous, "hostkv-linker")
        self._lock = threading.Lock()
        self._leases = {}      # rid -> (when, {part: {page key: page}}), from lookup
        self._unreleased = []  # (part, page) whose release hostkvd did not take
        self._queued = []      # [(rid, {part: (pages, slots)}, missing)] for the next start
        self._loading = collections.deque()  # _Batch in start order
        self._by_index = {}    # consumer index -> _Batch
        self._done = collections.deque()     # rid lists of completed batches
        self._indices = itertools.count()
        self.layer_done_counter = LayerCounter(self)
        for part in self._parts.values():
            logger.info("hostkv linker rank %d/%d: %s pool %s, namespace %s", rank, tp_size,
                        part.name, part.place.pool, part.place.namespace)

    @property
    def pools(self):
        """{part: hostkvd pool name} ("kv"; "swa" for a sliding-window
        model): where this rank's pages live."""
        return {name: part.place.pool for name, part in self._parts.items()}

    # -- the daemon, its sessions ----------------------------------------------

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
                imports = register_all(self._parts, client)
            except BaseException:
                client.close()
                raise
        except errors.HostKVError as e:
            logger.warning("no new hostkv session for the linker yet: %s", e)
            return False
        with self._lock:
            # Pages of the lost session went with it: loads not done yet can
            # copy nothing; they are reported in order, and their waits raise.
            self._queued = [(rid, {}, max(1, missing)) for rid, _, missing in self._queued]
            for batch in self._loading:
                if batch.pending is not None:
                    batch.pending = _Broken("hostkvd lost the session before the load ended")
                batch.leases = {}
            self._leases = {}
        self._unreleased = []
        old, self._client, self._imports = self._client, client, imports
        old.close()
        logger.warning("hostkvd lost the linker's session (rank %d); a new one is open",
                       self._rank)
        return True

    # -- lookups (the scheduler thread) ------------------------------------------

    def lookup(self, rid, transfers):
        answers = self._daemon_answers()
        self._drop_lease(rid)
        self._expire_leases()
        by_part = _by_part(transfers, self._parts)
        if by_part is None or not by_part[KV].keys or not answers:
            return []
        keys = [page_key(k) for k in by_part[KV].keys]
        pages, window = [], {}
        try:
            hits, pages = self._acquire(KV, keys)
            end = hits
            if hits and SWA in by_part:
                # Each length needs the window of pages ending there too.
                end, window = self._window_lease(keys, hits)
        except errors.HostKVError as e:
            self._release(KV, pages)
            logger.warning("lookup of %d pages for %s: %s %s; a miss", len(keys), rid,
                           e.code_name, e.message)
            return []
        self._release(KV, pages[end:])
        if not end:
            return []
        lease = {KV: dict(zip(keys[:end], pages[:end]))}
        if window:
            lease[SWA] = window
        with self._lock:
            self._leases[rid] = (time.monotonic(), lease)
        return [end] if SWA in by_part else list(range(1, end + 1))

    def _acquire(self, part, keys):
        """Lookup(acquire) in the part's namespace: (hits, their pages)."""
        place = self._parts[part].place
        found = self._client.lookup(place.pool, place.namespace, keys, acquire=True,
                                    wait=False)
        return found.hits, page_list(found.pages)

    def _window_lease(self, keys, hits):
        """The longest prefix length of at most `hits` pages whose sliding
        window (the window_pages pages ending there) is in the window pool,
        with the window's pages held: (length or 0, {key: page}). A window
        found short at its k-th page moves the end before that page (every
        longer window holds it); WINDOW_PROBES Lookups at most."""
        end = hits
        for _ in range(WINDOW_PROBES):
            if end <= 0:
                break
            begin = max(0, end - self._window_pages)
            window = keys[begin:end]
            found, pages = self._acquire(SWA, window)
            if found == len(window):
                return end, dict(zip(window, pages))
            self._release(SWA, pages)
            end = begin + found
        return 0, {}

    # -- loads ---------------------------------------------------------------------

    def load(self, rid, transfers):
        by_part = _by_part(transfers, self._parts)
        with self._lock:
            lease = self._leases.pop(rid, (0, {}))[1]
        if by_part is None or not by_part[KV].keys:
            self._release_lease(lease)
            return True  # nothing of ours to load: an empty batch entry
        queued, missing = {}, 0
        try:
            for name, transfer in by_part.items():
                keys = [page_key(k) for k in transfer.keys or ()]
                count = int(transfer.device_indices.numel())
                if count != len(keys) * self._page_size:
                    raise errors.InvalidArgument(
                        f"load {rid}: {count} {name} device slots for {len(keys)} pages of "
                        f"{self._page_size}")
                held = lease.get(name, {})
                lost = [k for k in keys if k not in held]
                if lost:
                    # Not from this rid's lookup (SGLang trims, never
                    # extends): the pages cannot be promised; the load's
                    # waits will raise.
                    logger.error("load %s: %d of %d %s pages were not found by its lookup",
                                 rid, len(lost), len(keys), name)
                    missing += len(lost)
                # A CUDA index tensor reaches the host by a copy on the
                # current stream that only the submission waits for.
                slots = self._imports[name].sync.host_indices(transfer.device_indices)
                queued[name] = ([held.pop(k) for k in keys if k in held], slots)
        except BaseException:
            self._release_lease(lease)
            for name, (pages, _) in queued.items():
                self._release(name, pages)
            raise
        self._release_lease(lease)  # found but trimmed away
        with self._lock:
            self._queued.append((rid, queued, missing))
        return True

    def start_layer_wise_loading(self):
        with self._lock:
            queued, self._queued = self._queued, []
        if not queued:
            return -1
        index = next(self._indices)
        rids = [rid for rid, _, _ in queued]
        broken = sum(missing for _, _, missing in queued)
        leases = collections.defaultdict(list)
        slots = collections.defaultdict(list)
        for _, parts, _ in queued:
            for name, (pages, part_slots) in parts.items():
                leases[name].extend(pages)
                slots[name].append(part_slots)
        pending = None
        if broken:
            pending = _Broken(f"{broken} pages of the batch were not in hostkvd (not found "
                              "by the lookup, or the session was lost)")
        elif any(leases.values()):
            pending = {name: self._submit_load(name, pages, slots[name])
                       for name, pages in leases.items() if pages}
        batch = _Batch(index, rids, pending, dict(leases), self._imports, self._client)
        with self._lock:
            self._loading.append(batch)
            self._by_index[index] = batch
        return index

    def _submit_load(self, name, pages, slots):
        """slots: the requests' device indices (host_indices objects)."""
        client, registered = self._client, self._imports[name]
        sync, pool = registered.sync, self._parts[name].place.pool
        host = page_runs(pages)
        # The slots may still be written by work queued on the current
        # stream (CUDA): the daemon's copy waits for this mark.
        mark = sync.mark_kv_written()
        value = sync.signal_value()
        pending = Pending(0, self._parts[name].kv.layers, value)

        def call():
            try:
                device = page_runs([int(s) for obj in slots for s in obj.get().tolist()])
                gpu = {"signal_value": value, "gpu_waits_only": True} if value else {}
                return client.load(pool, registered.import_id, host, device,
                                   wait_kv_written=mark, **gpu)
            except BaseException:
                # No copy will signal `value`: let the streams waiting for it
                # go on (the waits then raise on the host).
                sync.failed(pending)
                raise

        pending.future = self._submitter.submit(call)
        return pending

    def wait_layer(self, index, layer):
        """layer_done_counter.wait_until: layer `layer` (SGLang's id, of
        every part) of batch `index` is in place (CUDA: the current stream
        waits for it). RuntimeError for a batch whose pages could not be
        loaded (never stale KV)."""
        with self._lock:
            batch = self._by_index.get(index)
        if batch is None or batch.pending is None:
            return
        if isinstance(batch.pending, _Broken):
            raise RuntimeError(f"hostkv load batch {index}: {batch.pending.reason}")
        name, local = self._route(layer)
        pending = batch.pending.get(name)
        if pending is None:
            return  # nothing of that part in the batch (or not a layer of ours)
        sync = batch.imports[name].sync
        if sync.asynchronous:
            try:
                pending.operation(0)
            except TimeoutError:
                pass  # not submitted yet: the stream wait covers it
            except Exception as e:  # pylint: disable=broad-except
                raise RuntimeError(f"hostkv load batch {index} was not submitted: {e}") from e
        sync.wait_layer(pending, local)

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
            self._release_lease(batch.leases)
        with self._lock:
            return len(self._done)

    def pop_completed_load(self):
        with self._lock:
            return self._done.popleft()

    def _ended(self, batch, timeout=0):
        if batch.pending is None or isinstance(batch.pending, _Broken):
            return True
        for name, pending in batch.pending.items():
            try:
                op = pending.operation(timeout)
                batch.client.wait(op, timeout=timeout if timeout is not None else 600.0)
            except (errors.DeadlineExceeded, TimeoutError):
                return False
            except Exception as e:  # pylint: disable=broad-except
                logger.error("load batch %d (%s): %s", batch.index, name, e)
        return True

    # -- offloads ----------------------------------------------------------------

    def offload(self, transfers):
        """Every transfer (KV, and the window's pages of a sliding-window
        model; SGLang's sparse window retention offloads windows alone) in
        one offload: True once queued, its result later."""
        parts = []
        for t in transfers:
            name = str(getattr(t.name, "value", t.name)).lower()
            if name not in self._parts:
                return False  # a pool this linker cannot store: nothing is
            if t.keys:
                parts.append((name, [page_key(k) for k in t.keys], t.device_indices))
        return self._offloads.put(parts) if parts else False

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
            self._release_lease(batch.leases)
        for _, parts, _ in queued:
            for name, (pages, _) in parts.items():
                self._release(name, pages)
        for lease in leases:
            self._release_lease(lease)

    # -- references ------------------------------------------------------------

    def _drop_lease(self, rid):
        with self._lock:
            lease = self._leases.pop(rid, None)
        if lease:
            self._release_lease(lease[1])

    def _expire_leases(self):
        """SGLang looks up and loads in one scheduling pass, and calls
        nothing when the ranks agree on less than this one found or the
        request leaves: leases older than LEASE_SECONDS go."""
        now = time.monotonic()
        with self._lock:
            old = [rid for rid, (t, _) in self._leases.items() if now - t > LEASE_SECONDS]
            leases = [self._leases.pop(rid)[1] for rid in old]
        for lease in leases:
            self._release_lease(lease)

    def _release_lease(self, lease):
        """lease: {part: {key: page}} or {part: [pages]}."""
        for name, held in lease.items():
            self._release(name, list(held.values()) if isinstance(held, dict) else held)

    def _release(self, name, pages):
        """Gives references back without waiting for an absent daemon; what
        it did not take is given back once it answers (never forgotten: the
        client would take those references again at a resume)."""
        if not pages:
            return
        if self._client.daemon_away:
            self._unreleased.extend((name, p) for p in pages)
            return
        pool = self._parts[name].place.pool
        try:
            self._client.release(pool, page_runs(sorted(pages)), wait=False)
        except errors.FailedPrecondition:
            for page in pages:  # all or nothing: those still held, one by one
                try:
                    self._client.release(pool, [(page, 1)], wait=False)
                except errors.FailedPrecondition:
                    pass
                except errors.HostKVError:
                    self._unreleased.append((name, page))
        except errors.HostKVError as e:
            logger.warning("releasing %d %s pages: %s; again once hostkvd answers", len(pages),
                           name, e)
            self._unreleased.extend((name, p) for p in pages)

    def _release_unreleased(self):
        if self._unreleased and not self._client.daemon_away:
            held, self._unreleased = self._unreleased, []
            by_part = collections.defaultdict(list)
            for name, page in held:
                by_part[name].append(page)
            for name, pages in by_part.items():
                self._release(name, pages)


class _Broken:
    """A batch whose pages could not all be found: nothing was copied."""

    def __init__(self, reason):
        self.reason = reason
