"""The device pools HostkvLinker restores, one Part each (SGLang's
PoolName of the transfers it is given), and which part a forward-pass
layer reads. No SGLang imports.

A plain MHA or MLA model has one part, "kv". A hybrid sliding-window model
(SGLang's SWAKVPool, mem_cache/swa_memory_pool.py @00381c02) has two: "kv",
the full-attention layers (its full_kv_pool), and "swa", the window layers
(its swa_kv_pool, indexed by SWA slots of their own). Each part has its own
hostkvd pool and namespace (the layer sets differ; a page's key is SGLang's
page hash in both) and its own registration of device buffers. SWAKVPool
waits on the layer counter with global layer ids; its layers_mapping says
which part and which of its layers that is.
"""
from .. import errors
from .. import torch as hostkv_torch
from .linker_pool import DeviceKv, Placement
from .transfer_sync import sync_for

KV, SWA = "kv", "swa"


class Part:
    """One device pool: its buffers (DeviceKv), its hostkvd pool and
    namespace (Placement), the pool's capacity when this engine makes it."""

    def __init__(self, name, kv, place, capacity):
        self.name, self.kv, self.place, self.capacity = name, kv, place, int(capacity)

    def register(self, client):
        """Attaches the pool and registers the buffers with `client`'s
        session: Registered (import id, the waits for transfers on them)."""
        self._attach(client)
        planes = [[hostkv_torch.describe(client, t) for t in plane] for plane in self.kv.planes]
        sync = sync_for(client, self.kv.planes[0][0], self.kv.layers)
        import_id = client.register_device_buffers(
            self.place.pool, self.kv.rows, planes[0], planes[1] if len(planes) > 1 else (),
            gpu_signals=sync.gpu_signals())
        sync.attach(import_id)
        return Registered(import_id, sync)

    def _attach(self, client):
        spec = self.kv.pool_spec(self.place.pool, self.capacity)
        try:
            client.create_pool(spec, attach_if_exists=True)
        except errors.AlreadyExists:
            have = client.get_pool(self.place.pool).spec
            if (have.geometry, have.page_size) != (spec.geometry, spec.page_size):
                raise


class Registered:
    __slots__ = ("import_id", "sync")

    def __init__(self, import_id, sync):
        self.import_id, self.sync = import_id, sync


def register_all(parts, client):
    """Every part registered with `client`'s session: {name: Registered}."""
    return {name: part.register(client) for name, part in parts.items()}


class LayerRoute:
    """The forward pass's layer ids (the counter's wait_until argument) to
    (part name, the part's layer)."""

    def __init__(self, mapping=None, layers=0):
        self._mapping = dict(mapping) if mapping is not None else None
        self._layers = int(layers)

    def __call__(self, layer):
        if self._mapping is None:
            return (KV, layer) if 0 <= layer < self._layers else (None, -1)
        return self._mapping.get(layer, (None, -1))


def build_parts(kvcache, page_size, model, tp_size, rank, extra, pool_prefix, capacity,
                swa_capacity=None, owner=""):
    """({name: Part}, LayerRoute) for SGLang's device pool `kvcache`."""
    full = getattr(kvcache, "full_kv_pool", None)
    window = getattr(kvcache, "swa_kv_pool", None)
    if full is None and window is None:
        kv = DeviceKv(kvcache, page_size)
        part = Part(KV, kv, Placement(model, kv, tp_size, rank, extra, pool_prefix, owner), capacity)
        return {KV: part}, LayerRoute(layers=kv.layers)
    if full is None or window is None or not hasattr(kvcache, "layers_mapping"):
        raise errors.InvalidArgument(
            f"{type(kvcache).__name__}: a sliding-window pool needs full_kv_pool, "
            "swa_kv_pool and layers_mapping")
    kv_full, kv_window = DeviceKv(full, page_size), DeviceKv(window, page_size)
    if kv_full.start_layer != kv_window.start_layer:
        raise errors.InvalidArgument("the full and window pools start at different layers")
    kv_full.start_layer = kv_window.start_layer = int(getattr(kvcache, "start_layer", 0) or 0)
    full_bytes, window_bytes = kv_full.page_bytes(), kv_window.page_bytes()
    if swa_capacity is None:  # the rank's capacity shared by the bytes of a page of each
        swa_capacity = capacity * window_bytes // (full_bytes + window_bytes)
        capacity -= swa_capacity
    mapping = {int(g): (SWA if is_window else KV, int(local))
               for g, (local, is_window) in kvcache.layers_mapping.items()}
    for name, kv in ((KV, kv_full), (SWA, kv_window)):
        locals_ = sorted(local for n, local in mapping.values() if n == name)
        if locals_ != list(range(kv.layers)):
            raise errors.InvalidArgument(
                f"layers_mapping names {len(locals_)} {name} layers for a pool of {kv.layers}")
    parts = {
        KV: Part(KV, kv_full, Placement(model, kv_full, tp_size, rank, f"{extra};part=kv",
                                        pool_prefix, owner), capacity),
        SWA: Part(SWA, kv_window, Placement(model, kv_window, tp_size, rank,
                                            f"{extra};part=swa", pool_prefix, owner), swa_capacity),
    }
    parts[SWA].place.namespace += ":swa"
    return parts, LayerRoute(mapping)
