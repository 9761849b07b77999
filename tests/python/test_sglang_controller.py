"""hostkv's SGLang drop-ins (RemoteMHATokenToKVPoolHost,
RemoteMLATokenToKVPoolHost, HostkvStorage) driven by a stand-in of the
SGLang code that calls them (tests/python/sglang_standin), rebuilt from
SGLang's public source so that when our classes drift from what SGLang
calls, a test here fails. What is modelled, and at which commit:

- python/sglang/srt/managers/cache_controller.py @001067ff
  (HiCacheController: write / start_writing, load / start_loading with the
  LayerDoneCounter ring, evict_*, attach_storage_backend and the storage
  threads: hit query, page transfer, backup)
- python/sglang/srt/mem_cache/l2_transfer.py @67e863cd (layer_num=,
  load_to_device_per_layer(..., is_draft=)) and @086fe1aa
  (transfer_layer_id_max=, prepare_transfer_indices, *_physical)
- python/sglang/srt/mem_cache/hiradix_cache.py @39baee9e (how the host
  pool and the controller are built; the scheduler's steps around them)
- python/sglang/srt/mem_cache/hicache_storage.py and
  storage/backend_factory.py @001067ff (HiCacheStorage, its config, the
  dynamic backend path: backend_class(storage_config, kwargs), the
  issubclass check, register_mem_pool_host)
- python/sglang/srt/mem_cache/pool_host/base.py @39baee9e / @086fe1aa,
  mha.py @39baee9e, mla.py @c7631876 (the host pool's signatures, sizing,
  and what SGLang calls and reads on it)

The bytes are checked against tests/python/sglang_model.HostModel (an
independent model of SGLang's host layouts).
"""
import functools
import inspect
import itertools
import json
import threading

import pytest

torch = pytest.importorskip("torch")

import hostkv  # noqa: E402
from hostkv.sglang import (RemoteMHATokenToKVPoolHost,  # noqa: E402
                           RemoteMLATokenToKVPoolHost)

from sglang_model import DevicePool, HostModel, page_keys  # noqa: E402
import sglang_standin  # noqa: E402
from sglang_standin.srt import cpu_device  # noqa: E402
from sglang_standin.srt.managers import cache_controller  # noqa: E402
from sglang_standin.srt.mem_cache import hicache_storage, hiradix_cache, memory_pool  # noqa: E402
from sglang_standin.srt.mem_cache import utils as mem_cache_utils  # noqa: E402
from sglang_standin.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: E402
from sglang_standin.srt.mem_cache.pool_host import base as host_base  # noqa: E402
from sglang_standin.srt.mem_cache.pool_host import mha as host_mha  # noqa: E402
from sglang_standin.srt.mem_cache.pool_host import mla as host_mla  # noqa: E402

LAYERS = 3
CONTROLLERS = cache_controller.CONTROLLERS  # L2 engine version -> controller
PAIRS = {  # the (layout, io_backend) pairs SGLang's host pools implement
    "mha": [("layer_first", "kernel"), ("layer_first", "direct"), ("page_first", "kernel"),
            ("page_first_direct", "direct"), ("page_head", "kernel")],
    "mla": [("layer_first", "kernel"), ("layer_first", "direct"), ("page_first", "kernel"),
            ("page_first_direct", "direct")],
}
TRANSFER_CASES = [(a, layout, io, ps) for a in ("mha", "mla") for layout, io in PAIRS[a]
                  for ps in (1, 16)]
REMOTE = {"mha": RemoteMHATokenToKVPoolHost, "mla": RemoteMLATokenToKVPoolHost}
_unique = itertools.count()


class MHADevice(DevicePool, memory_pool.MHATokenToKVPool):
    """sglang_model's device pool, as SGLang's MHATokenToKVPool."""


class MLADevice(DevicePool, memory_pool.MLATokenToKVPool):
    """sglang_model's device pool, as SGLang's MLATokenToKVPool."""


def make_device(attention, page_size, tokens=None):
    tokens = tokens or max(8 * page_size, 32)
    cls = MHADevice if attention == "mha" else MLADevice
    return cls(attention, LAYERS, size=tokens, page_size=page_size)


def host_classes(daemon, **kwargs):
    """The classes SGLang's modules would name after install(), bound to
    the test's daemon."""
    return hiradix_cache.HostPoolClasses(
        MHATokenToKVPoolHost=functools.partial(RemoteMHATokenToKVPoolHost,
                                               target=daemon.target, **kwargs),
        MLATokenToKVPoolHost=functools.partial(RemoteMLATokenToKVPoolHost,
                                               target=daemon.target, **kwargs))


def row_shape(device):
    if device.attention == "mha":
        return (device.head_num, device.head_dim)
    return (1, device.kv_lora_rank + device.qk_rope_head_dim)


def raw(tensor):
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def pairs(host_indices, device_indices):
    """Which host slot goes with which device slot (order-free)."""
    return sorted(zip(host_indices.tolist(), device_indices.tolist()))


def scattered_device_slots(allocator, count):
    """`count` device slots, every other unit (page, or token for page
    size 1) of a fresh run; the units in between are freed again."""
    unit = allocator.page_size
    rows = allocator.alloc(2 * count).view(-1, unit)
    allocator.free(rows[0::2].flatten())
    return rows[1::2].flatten().clone()


class Spy:
    """Records the calls SGLang's code makes on an object's methods
    (instance attributes wrapping the bound methods: isinstance and
    everything else stay as they are). Calls the object makes on itself
    from inside a recorded call (e.g. a *_physical default delegating) are
    not SGLang's and are not recorded. A method the object lacks is left
    missing."""

    def __init__(self, obj, names):
        self.calls = []
        self._depth = threading.local()
        for name in names:
            real = getattr(obj, name, None)
            if callable(real):
                setattr(obj, name, self._wrap(name, real))

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            depth = getattr(self._depth, "n", 0)
            if depth == 0:
                self.calls.append((name, args, kwargs))
            self._depth.n = depth + 1
            try:
                return real(*args, **kwargs)
            finally:
                self._depth.n = depth
        return call

    def named(self, *names):
        return [c for c in self.calls if c[0] in names]


WRITE_CALLS = ("alloc", "backup_from_device_all_layer", "prepare_transfer_indices",
               "backup_from_device_all_layer_physical")
LOAD_CALLS = ("load_to_device_per_layer", "prepare_transfer_indices",
              "load_to_device_per_layer_physical")


def new_controller(engine, device, page_size, host, io_backend, **kwargs):
    allocator = TokenToKVPoolAllocator(device.size, page_size, device)
    controller = CONTROLLERS[engine](allocator, host, page_size, None, threading.Event(),
                                     write_policy="write_through", io_backend=io_backend,
                                     **kwargs)
    return allocator, controller


def check_write_calls(engine, calls, device, host_idx, dev_idx, io_backend):
    assert calls[0] == ("alloc", (len(dev_idx),), {})
    moves = calls[1:]
    if engine == "67e863cd":
        assert [c[0] for c in moves] == ["backup_from_device_all_layer"]
        _, args, kwargs = moves[0]
    else:
        assert [c[0] for c in moves] == ["prepare_transfer_indices",
                                         "backup_from_device_all_layer_physical"]
        _, prep_args, prep_kwargs = moves[0]
        assert len(prep_args) == 3 and prep_args[2] == io_backend and prep_kwargs == {}
        assert pairs(prep_args[0], prep_args[1]) == pairs(host_idx, dev_idx)
        _, args, kwargs = moves[1]
    assert len(args) == 4 and args[0] is device and args[3] == io_backend and kwargs == {}
    assert pairs(args[1], args[2]) == pairs(host_idx, dev_idx)


# -- construction: as HiRadixCache builds the host pool ------------------------------

SIZING = [  # page_size, device tokens, hicache_ratio, host_page_num -> host pool size
    (16, 64, 4.0, 9, 144),     # host_page_num: exactly that many pages (ratio 4 would give 17)
    (16, 64, 2.0, 3, 48),      # ... even below the device pool's size
    (16, 64, 2.0, None, 144),  # ratio: 128 tokens -> 128 // 16 + 1 pages
    (16, 64, 1.0, None, 80),   # the extra page also when the size is page-aligned
    (16, 64, 0.5, None, 48),   # smaller than the device pool: SGLang only warns
    (1, 64, 2.0, None, 129),
    (1, 64, 2.0, 100, 100),
]


@pytest.mark.parametrize("page_size,tokens,ratio,host_page_num,expected", SIZING)
@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_hiradix_builds_and_sizes_the_host_pool_as_sglang(daemon, attention, page_size, tokens,
                                                         ratio, host_page_num, expected):
    device = make_device(attention, page_size, tokens)
    params = hiradix_cache.CacheInitParams(
        token_to_kv_pool_allocator=TokenToKVPoolAllocator(tokens, page_size, device),
        page_size=page_size, hicache_host_page_num=host_page_num)
    args = hiradix_cache.ServerArgs(hicache_ratio=ratio, hicache_size=0,
                                    hicache_mem_layout="page_first")
    host = hiradix_cache.build_token_to_kv_pool_host(device, args, params, host_classes(daemon))
    try:
        assert isinstance(host, REMOTE[attention])
        assert (host.size, host.page_num) == (expected, expected // page_size)
        assert host.available_size() == expected
        assert host.alloc(expected) is not None
        assert host.alloc(page_size) is None
    finally:
        host.close()


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_a_host_page_num_below_one_is_refused(daemon, attention):
    device = make_device(attention, 16, 64)
    params = hiradix_cache.CacheInitParams(
        token_to_kv_pool_allocator=TokenToKVPoolAllocator(64, 16, device), page_size=16,
        hicache_host_page_num=0)
    with pytest.raises(ValueError, match="HiCache host page count must be positive, got 0"):
        host = hiradix_cache.build_token_to_kv_pool_host(device, hiradix_cache.ServerArgs(),
                                                         params, host_classes(daemon))
        host.close()


# -- device -> host: write-through ---------------------------------------------------

@pytest.mark.parametrize("engine", list(CONTROLLERS))
@pytest.mark.parametrize("attention,layout,io_backend,page_size", TRANSFER_CASES)
def test_write_through_lands_in_the_host_pool(daemon, attention, layout, io_backend, page_size,
                                              engine):
    device = make_device(attention, page_size)
    host = REMOTE[attention](device, 2.0, 0, page_size, layout, target=daemon.target)
    try:
        allocator, controller = new_controller(engine, device, page_size, host, io_backend)
        assert device.layer_transfer_counter is controller.layer_done_counter
        device.fill_random(torch.Generator().manual_seed(page_size * 7 + len(layout)))
        n = 2 * max(page_size, 4)
        dev_idx = scattered_device_slots(allocator, n)
        host.alloc(page_size)  # the write's pages do not start at slot 0
        spy = Spy(host, WRITE_CALLS)
        host_idx = controller.write(dev_idx, node_id=7)
        assert host_idx is not None and host_idx.dtype == torch.int64 and host_idx.numel() == n
        check_write_calls(engine, spy.calls, device, host_idx, dev_idx, io_backend)
        (ack,) = controller.ack_write_queue
        assert ack.node_ids == [7] and ack.num_tokens == n
        assert ack.num_bytes == n * host.size_per_token and ack.num_tokens_by_pool == {"kv": n}
        assert ack.finish_event.query()
        assert ack.finish_event.recorded_on is controller.l2_transfer_engine.device_to_host_stream
        ack.finish_event.synchronize()

        model = HostModel(attention, layout, LAYERS, host.size, page_size, row_shape(device),
                          device.store_dtype)
        model.backup(device, host_idx, dev_idx)
        for index in host_idx[::page_size].tolist():
            assert raw(host.get_data_page(index)) == raw(model.page(index)), index
        assert controller.evict_host(host_idx) == n
        assert host.available_size() == host.size - page_size
    finally:
        host.close()


# -- host -> device: load back, layer by layer --------------------------------------------

@pytest.mark.parametrize("engine", list(CONTROLLERS))
@pytest.mark.parametrize("attention,layout,io_backend,page_size", TRANSFER_CASES)
def test_load_back_signals_each_layer_when_it_is_in_place(daemon, attention, layout, io_backend,
                                                          page_size, engine):
    device = make_device(attention, page_size)
    host = REMOTE[attention](device, 2.0, 0, page_size, layout, target=daemon.target)
    try:
        allocator, controller = new_controller(engine, device, page_size, host, io_backend)
        device.fill_random(torch.Generator().manual_seed(page_size * 11 + len(layout)))
        n = 2 * max(page_size, 4)
        dev_idx = scattered_device_slots(allocator, n)
        host_idx = controller.write(dev_idx, node_id=7)
        controller.ack_write_queue.pop(0).finish_event.synchronize()
        original = [[t.clone() for t in layers] for layers in device.planes()]

        target = controller.load(host_idx, node_id=8)
        assert target is not None and target.numel() == n
        assert not set(target.tolist()) & set(dev_idx.tolist())
        for layers in device.planes():
            for t in layers:
                t[target] = 0
        spy = Spy(host, LOAD_CALLS)
        assert spy.calls == [] and controller.ack_load_queue == []  # load() only queues

        counter = controller.layer_done_counter
        signalled = []
        for slot, event in enumerate(counter.events):
            def complete(layer, _real=event.complete, _slot=slot):
                # on_layer_done(layer): that layer must be in place now.
                for plane, layers in enumerate(device.planes()):
                    assert raw(layers[layer][target]) == raw(original[plane][layer][dev_idx]), \
                        (plane, layer)
                signalled.append((_slot, layer))
                _real(layer)
            event.complete = complete
        producer = controller.start_loading()
        assert producer == 0 and signalled == [(0, layer) for layer in range(LAYERS)]

        if engine == "67e863cd":
            loads = spy.calls
        else:
            assert [c[0] for c in spy.calls[:1]] == ["prepare_transfer_indices"]
            _, prep_args, prep_kwargs = spy.calls[0]
            assert len(prep_args) == 3 and prep_args[2] == io_backend and prep_kwargs == {}
            assert pairs(prep_args[0], prep_args[1]) == pairs(host_idx, target)
            loads = spy.calls[1:]
        name = "load_to_device_per_layer" if engine == "67e863cd" else \
            "load_to_device_per_layer_physical"
        assert [c[0] for c in loads] == [name] * LAYERS
        for layer, (_, args, kwargs) in enumerate(loads):
            assert len(args) == 5 and args[0] is device and args[3:] == (layer, io_backend)
            assert kwargs == {"is_draft": False}
            assert pairs(args[1], args[2]) == pairs(host_idx, target)

        engine_ = controller.l2_transfer_engine
        (ack,) = controller.ack_load_queue
        assert ack.node_ids == [8] and ack.num_tokens == n
        assert ack.finish_event.recorded_on is engine_.host_to_device_stream
        slot = counter.events[producer]
        assert slot.start_event in engine_.host_to_device_stream.waited_events
        for event in slot.load_events:
            assert event.recorded_on is engine_.host_to_device_stream and event.record_count == 1
        # The forward pass (consumer) waits on each layer's event before using it.
        counter.set_consumer(producer)
        compute = cpu_device.current_stream()
        before = len(compute.waited_events)
        for layer in range(LAYERS):
            device.get_key_buffer(layer)
        assert compute.waited_events[before:] == slot.load_events

        for plane, layers in enumerate(device.planes()):
            for layer in range(LAYERS):
                assert raw(layers[layer][target]) == raw(original[plane][layer][dev_idx])
                assert raw(layers[layer][dev_idx]) == raw(original[plane][layer][dev_idx])
        assert controller.evict_device(target) == n
    finally:
        host.close()


@pytest.mark.parametrize("engine", list(CONTROLLERS))
def test_hiradix_round_trips_around_the_layer_counter_ring(daemon, engine):
    """Write-through once, then load back four times: the LayerDoneCounter's
    three slots wrap, HiRadixCache's checks see every load done."""
    device = make_device("mha", 16)
    allocator = TokenToKVPoolAllocator(device.size, 16, device)
    params = hiradix_cache.CacheInitParams(token_to_kv_pool_allocator=allocator, page_size=16)
    args = hiradix_cache.ServerArgs(hicache_mem_layout="page_first", hicache_io_backend="kernel")
    driver = hiradix_cache.HiRadixDriver(params, args, host_classes(daemon),
                                         controller_cls=CONTROLLERS[engine])
    try:
        device.fill_random(torch.Generator().manual_seed(3))
        dev_idx = allocator.alloc(32)
        host_idx = driver.write_backup(dev_idx, node_id=1)
        assert host_idx is not None and driver.writing_check() == [1]
        original = [[t[dev_idx].clone() for t in layers] for layers in device.planes()]
        for round_ in range(4):
            target = driver.load_back(host_idx, node_id=10 + round_)
            for layers in device.planes():
                for t in layers:
                    t[target] = 0
            producer = driver.ready_to_load_host_cache()
            assert producer == round_ % 3
            assert driver.is_load_back_event_done(producer)
            assert driver.ongoing_load_back == {}
            for plane, layers in enumerate(device.planes()):
                for layer in range(LAYERS):
                    assert raw(layers[layer][target]) == raw(original[plane][layer])
            driver.cache_controller.evict_device(target)
        assert driver.ready_to_load_host_cache() == -1
    finally:
        driver.shutdown()


# -- storage: backup by one engine, prefetch by another ------------------------------------

PREFETCH_CASES = [  # attention, layout, io_backend, page_size, pages (130: two batches)
    ("mha", "page_first", "kernel", 16, 4),
    ("mla", "page_first_direct", "direct", 1, 130),
]


@pytest.fixture
def as_sglang():
    """The stand-in importable as sglang, hostkv.sglang.storage imported
    afresh under it (so HostkvStorage subclasses its HiCacheStorage, as
    with SGLang installed)."""
    with sglang_standin.as_sglang():
        yield


def storage_engine(daemon, attention, layout, io_backend, page_size, tokens, pool_name,
                   model_name, interface_v1):
    device = make_device(attention, page_size, tokens)
    allocator = TokenToKVPoolAllocator(device.size, page_size, device)
    extra = {"backend_name": "hostkv", "module_path": "hostkv.sglang.storage",
             "class_name": "HostkvStorage", "target": daemon.target,
             "prefetch_threshold": page_size}
    if interface_v1:
        extra["interface_v1"] = True
    args = hiradix_cache.ServerArgs(
        hicache_ratio=4.0, hicache_mem_layout=layout, hicache_io_backend=io_backend,
        hicache_storage_backend="dynamic", hicache_storage_backend_extra_config=json.dumps(extra),
        served_model_name=model_name)
    params = hiradix_cache.CacheInitParams(token_to_kv_pool_allocator=allocator,
                                           page_size=page_size)
    driver = hiradix_cache.HiRadixDriver(params, args, host_classes(daemon, pool_name=pool_name))
    return device, allocator, driver


@pytest.mark.parametrize("interface_v1", [True, False], ids=["v1", "generic"])
@pytest.mark.parametrize("attention,layout,io_backend,page_size,pages", PREFETCH_CASES)
def test_prefetch_finds_and_loads_what_another_engine_backed_up(
        daemon, as_sglang, attention, layout, io_backend, page_size, pages, interface_v1):
    n = pages * page_size
    tokens = n + 2 * max(page_size, 16)
    pool_name = f"standin-prefetch-{next(_unique)}"
    model_name = f"standin/model-{next(_unique)}"
    engines = []
    try:
        for _ in range(2):
            engines.append(storage_engine(daemon, attention, layout, io_backend, page_size,
                                          tokens, pool_name, model_name, interface_v1))
        (dev_a, alloc_a, a), (_, _, b) = engines
        cc_a, cc_b = a.cache_controller, b.cache_controller
        for cc in (cc_a, cc_b):
            assert isinstance(cc.storage_backend, hicache_storage.HiCacheStorage)
            assert type(cc.storage_backend).__name__ == "HostkvStorage"
            assert cc.storage_backend.mem_pool_host is cc.mem_pool_host
            config = cc.storage_config
            assert isinstance(config, hicache_storage.HiCacheStorageConfig)
            assert (config.tp_rank, config.tp_size, config.model_name) == (0, 1, model_name)
            assert config.is_mla_model == (attention == "mla")
            assert config.is_page_first_layout == (layout == "page_first")
            assert "prefetch_threshold" not in config.extra_config  # the tree cache popped it
            # pylint: disable-next=protected-access
            zero_copy = (cc.page_get_func == cc._page_get_zero_copy,
                         cc.page_set_func == cc._page_set_zero_copy)
            assert zero_copy == (interface_v1, interface_v1)
        tp = "mla" if attention == "mla" else "tp0-1"
        assert cc_a.storage_backend.namespace == f"sglang/{model_name}/{tp}/p{page_size}/sha256"
        assert cc_b.storage_backend.namespace == cc_a.storage_backend.namespace

        prompt = torch.randint(0, 150_000, (n,),
                               generator=torch.Generator().manual_seed(pages)).tolist()
        keys = mem_cache_utils.get_hash_str(prompt, None, page_size=page_size)
        assert keys == page_keys(prompt, page_size) and len(keys) == pages
        batches = [keys[i:i + hicache_storage.STORAGE_BATCH_SIZE]
                   for i in range(0, pages, hicache_storage.STORAGE_BATCH_SIZE)]

        # Engine A: write-through, then backup of the host pages to storage.
        dev_a.fill_random(torch.Generator().manual_seed(pages + 1))
        dev_idx = alloc_a.alloc(n)
        host_a = a.write_backup(dev_idx, node_id=1)
        assert host_a is not None and a.writing_check() == [1]
        storage_spy_a = Spy(cc_a.storage_backend, ("batch_set_v1", "batch_set"))
        pool_spy_a = Spy(cc_a.mem_pool_host, ("get_data_page",))
        op_id = a.write_backup_storage(host_a, prompt, keys)
        backup = a.wait_backup(op_id, timeout=60)
        assert backup.completed_tokens == n
        if interface_v1:
            calls = storage_spy_a.named("batch_set_v1")
            assert [c[1][0] for c in calls] == batches
            for i, (_, (_, host_slice, extra_info), kwargs) in enumerate(calls):
                first = i * hicache_storage.STORAGE_BATCH_SIZE * page_size
                assert torch.equal(host_slice, host_a[first:first + host_slice.numel()])
                assert extra_info == hicache_storage.HiCacheStorageExtraInfo(prefix_keys=None)
                assert kwargs == {}
            assert storage_spy_a.named("batch_set") == []
        else:
            calls = storage_spy_a.named("batch_set")
            assert [c[1][0] for c in calls] == batches
            assert [len(c[1][1]) for c in calls] == [len(batch) for batch in batches]
            assert [int(c[1][0]) for c in pool_spy_a.calls] == host_a[::page_size].tolist()
            assert storage_spy_a.named("batch_set_v1") == []

        # Engine B: the scheduler's hit query, then the prefetch.
        storage_spy_b = Spy(cc_b.storage_backend, ("batch_exists", "batch_get_v1", "batch_get"))
        pool_spy_b = Spy(cc_b.mem_pool_host, ("get_dummy_flat_data_page",
                                               "set_from_flat_data_page"))
        hashes, hits = b.query_storage_hit_length(prompt)
        assert (hashes, hits) == (keys, n)
        op = b.prefetch_from_storage("request-b", prompt)
        assert op is not None
        assert b.drain_prefetch_hit(timeout=60) is op
        assert op.storage_hit_count == n and op.hash_value == keys
        assert op.host_indices is not None and op.host_indices.numel() == n
        acks = b.wait_prefetch(op, timeout=60)
        progress = [ack.completed_tokens for ack in acks if not ack.completed_req]
        assert progress == [min((i + 1) * hicache_storage.STORAGE_BATCH_SIZE, pages) * page_size
                            for i in range(len(batches))]
        assert acks[-1].completed_req and op.completed_tokens == n
        assert b.check_prefetch_progress(op) == n

        exists = storage_spy_b.named("batch_exists")
        assert [c[1][0] for c in exists] == batches * 2  # the scheduler's query, the thread's
        assert all(c[1][1] == hicache_storage.HiCacheStorageExtraInfo() for c in exists)
        if interface_v1:
            gets = storage_spy_b.named("batch_get_v1")
            assert [c[1][0] for c in gets] == batches
            assert storage_spy_b.named("batch_get") == []
        else:
            gets = storage_spy_b.named("batch_get")
            assert [c[1][0] for c in gets] == batches
            assert [len(c[1][1]) for c in gets] == [len(batch) for batch in batches]
            sets = pool_spy_b.named("set_from_flat_data_page")
            assert [int(c[1][0]) for c in sets] == op.host_indices[::page_size].tolist()
            assert storage_spy_b.named("batch_get_v1") == []

        # The prefetched pages hold engine A's KV, byte for byte.
        pool_a, pool_b = a.token_to_kv_pool_host, b.token_to_kv_pool_host
        model = HostModel(attention, layout, LAYERS, pool_a.size, page_size, row_shape(dev_a),
                          dev_a.store_dtype)
        model.backup(dev_a, host_a, dev_idx)
        for i in range(pages):
            want = raw(model.page(int(host_a[i * page_size])))
            assert raw(pool_a.get_data_page(int(host_a[i * page_size]))) == want, i
            assert raw(pool_b.get_data_page(int(op.host_indices[i * page_size]))) == want, i
        assert b.drain_storage_control_queues() == []
        assert cc_a.storage_thread_errors == [] and cc_b.storage_thread_errors == []
    finally:
        for _, _, driver in engines:
            driver.shutdown()
        with hostkv.Client(daemon.target, "standin-cleanup") as c:
            if any(p.spec.name == pool_name for p in c.list_pools()):
                c.delete_pool(pool_name)


# -- the signatures SGLang calls with ----------------------------------------------------

CONSTRUCTOR = ("device_pool", "host_to_device_ratio", "host_size", "page_size", "layout",
               "pin_memory", "device", "allocator_type")
CONTRACT = {"mha": host_mha.MHATokenToKVPoolHost, "mla": host_mla.MLATokenToKVPoolHost}
NINTH = {"mha": "host_page_num", "mla": "override_kv_cache_dim"}
_MOVE = ("device_pool", "host_indices", "device_indices")
# hostkv's own rule on top of SGLang's calls: SGLang keeps adding keywords
# to the transfer calls (is_draft came that way), so the drop-ins take any.
HOSTKV_CALLS = (
    host_base.Call("load_to_device_per_layer", _MOVE + ("layer_id", "io_backend"),
                   {"is_draft": False, "a_later_keyword": 1}, "hostkv: unknown keywords"),
    host_base.Call("backup_from_device_all_layer", _MOVE + ("io_backend",),
                   {"a_later_keyword": 1}, "hostkv: unknown keywords"),
)
CALL_CASES = [(a, call) for a, extra in (("mha", host_mha.CALLS), ("mla", host_mla.CALLS))
              for call in host_base.CALLS + extra + HOSTKV_CALLS]


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_constructor_takes_sglangs_arguments_in_sglangs_order(attention):
    cls = REMOTE[attention]
    ours = list(inspect.signature(cls).parameters.values())
    theirs = list(inspect.signature(CONTRACT[attention]).parameters.values())
    assert [p.name for p in ours[:8]] == list(CONSTRUCTOR), inspect.signature(cls)
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in ours[:8])
    for mine, sglangs in zip(ours[:8], theirs[:8]):
        if sglangs.default is not inspect.Parameter.empty:
            assert mine.default == sglangs.default, mine.name
    sig = inspect.signature(cls)
    sig.bind(*CONSTRUCTOR, NINTH[attention])  # SGLang's ninth positional parameter
    sig.bind(*CONSTRUCTOR, **{NINTH[attention]: 1})
    # hiradix_cache.py @39baee9e's call, for MHA and MLA alike:
    sig.bind(*CONSTRUCTOR[:5], allocator_type="dynamic", host_page_num=9)


@pytest.mark.parametrize("attention,call", CALL_CASES,
                         ids=[f"{a}-{i:02d}-{c.method}" for i, (a, c) in enumerate(CALL_CASES)])
def test_sglangs_calls_bind_to_the_drop_in(attention, call):
    cls = REMOTE[attention]
    method = getattr(cls, call.method, None)
    assert method is not None, f"{cls.__name__} has no {call.method} ({call.caller} calls it)"
    signature = inspect.signature(method)
    try:
        signature.bind("self", *call.args, **call.kwargs)
    except TypeError as e:
        given = call.args + tuple(f"{k}={v!r}" for k, v in call.kwargs.items())
        pytest.fail(f"{cls.__name__}.{call.method}{signature} cannot take "
                    f"{call.method}({', '.join(given)}) as {call.caller} makes it: {e}")


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_the_pool_has_what_sglang_reads_and_the_defaults_it_relies_on(daemon, attention):
    device = make_device(attention, 16, 64)
    host = REMOTE[attention](device, 2.0, 0, 16, "page_first", target=daemon.target)
    try:
        missing = {name: who for name, who in host_base.ATTRIBUTES.items()
                   if not hasattr(host, name)}
        assert not missing, f"{type(host).__name__} lacks what SGLang reads: {missing}"
        assert host.can_use_write_back_jit in (True, False)
        assert (host.layer_num, host.dtype, host.layout) == (LAYERS, device.store_dtype,
                                                             "page_first")
        assert host.page_num * host.page_size == host.size
        assert host.size_per_token == host.get_size_per_token()
        assert isinstance(host.is_stride_page_aligned(), bool)
        assert isinstance(host.is_stride_page_aligned(4096), bool)
        host_idx = host.alloc(16)
        dev_idx = torch.arange(16, 32)
        # A plain pool's indices are physical: prepare_transfer_indices keeps them.
        prepared = host.prepare_transfer_indices(host_idx, dev_idx, "kernel")
        assert isinstance(prepared, tuple) and len(prepared) == 2
        assert torch.equal(prepared[0], host_idx) and torch.equal(prepared[1], dev_idx)
        host.destroy()
        host.destroy()  # idempotent
    finally:
        host.close()


def test_the_standin_hash_is_sglangs_page_key():
    """Two independent writings of SGLang's page key agree (the stand-in's
    get_hash_str, sglang_model.page_keys)."""
    prompt = list(range(1000, 1050))
    assert mem_cache_utils.get_hash_str(prompt, None, page_size=16) == page_keys(prompt, 16)
    assert mem_cache_utils.get_hash_str(prompt[:16]) == page_keys(prompt[:16], 16)[0]
