"""SGLang's host-pool classes on hostkvd, checked against an independent
model (sglang_model.HostModel) for every layout x page size x attention x
io_backend that SGLang implements, plus allocation, errors and pages."""
import ctypes
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")

import hostkv  # noqa: E402
from hostkv.sglang import (RemoteMHATokenToKVPoolHost,  # noqa: E402
                           RemoteMLATokenToKVPoolHost)

from sglang_model import DevicePool, HostModel  # noqa: E402

LAYERS = 3
PAIRS = {  # SGLang's (layout, io_backend) pairs, REFERENCE.md
    "mha": [("layer_first", "kernel"), ("layer_first", "direct"), ("page_first", "kernel"),
            ("page_first_direct", "direct"), ("page_head", "kernel")],
    "mla": [("layer_first", "kernel"), ("layer_first", "direct"), ("page_first", "kernel"),
            ("page_first_direct", "direct")],
}
CASES = [(a, layout, io, ps) for a in ("mha", "mla") for layout, io in PAIRS[a]
         for ps in (1, 16, 64)]


def host_pool_for(daemon, device, layout, ratio=2.0, **kw):
    cls = RemoteMHATokenToKVPoolHost if device.attention == "mha" else RemoteMLATokenToKVPoolHost
    return cls(device, ratio, 0, device.page_size, layout, target=daemon.target, **kw)


def row_shape(device):
    if device.attention == "mha":
        return (device.head_num, device.head_dim)
    return (1, device.kv_lora_rank + device.qk_rope_head_dim)


def scattered_device_indices(device, count, generator):
    """`count` device slots in whole pages, in a shuffled page order (as a
    paged device allocator hands them out)."""
    ps = device.page_size
    pages = torch.randperm(device.size // ps, generator=generator)[:count // ps]
    return (pages.unsqueeze(1) * ps + torch.arange(ps)).flatten()


@pytest.mark.parametrize("attention,layout,io_backend,page_size", CASES)
def test_backup_then_per_layer_load_match_the_model(daemon, attention, layout, io_backend,
                                                    page_size):
    g = torch.Generator().manual_seed(page_size * 131 + len(layout))
    device = DevicePool(attention, LAYERS, size=4 * max(page_size, 4), page_size=page_size)
    host = host_pool_for(daemon, device, layout)
    try:
        model = HostModel(attention, layout, LAYERS, host.size, page_size, row_shape(device),
                          device.store_dtype)
        assert host.kv_buffer.shape == model.buf.shape
        # SGLang's sizing: ratio 2 -> 2 * size tokens, then one page more.
        assert host.size == (2 * device.size // page_size + 1) * page_size
        n = 2 * max(page_size, 4)
        device.fill_random(g)
        dev_idx = scattered_device_indices(device, n, g)
        host.alloc(page_size)  # so the next pages do not start at slot 0
        host_idx = host.alloc(n)
        assert host_idx.dtype == torch.int64 and host_idx.numel() == n
        host.backup_from_device_all_layer(device, host_idx, dev_idx, io_backend)
        model.backup(device, host_idx, dev_idx)
        assert torch.equal(host.kv_buffer.view(torch.uint8), model.buf.view(torch.uint8))

        # Pages for storage backends: data pages and zero-copy pointers.
        for index in host_idx[::page_size].tolist():
            assert torch.equal(host.get_data_page(index).view(torch.uint8),
                               model.page(index).view(torch.uint8))
        starts = host_idx[::page_size].tolist()
        pointers, sizes = host.get_page_buffer_meta(host_idx)
        assert [ctypes.string_at(p, s) for p, s in zip(pointers, sizes)] == \
            model.meta_bytes(starts)

        # Load into other device slots, layer by layer: after each call for
        # layer i, layer i is in place.
        target = scattered_device_indices(device, n, g)
        device.zero()
        expected = model.expected_device(device, host_idx, target)
        for layer in range(LAYERS):
            host.load_to_device_per_layer(device, host_idx, target, layer, io_backend)
            for plane, layers in enumerate(device.planes()):
                assert torch.equal(layers[layer].view(torch.uint8),
                                   expected[plane][layer].view(torch.uint8)), (plane, layer)
    finally:
        host.close()


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_alloc_free_accounting(daemon, attention):
    device = DevicePool(attention, LAYERS, size=64, page_size=16)
    host = host_pool_for(daemon, device, "page_first")
    try:
        assert host.size == 144 and host.available_size() == 144 and host.page_num == 9
        a = host.alloc(64)
        b = host.alloc(80)
        assert host.available_size() == 0
        assert host.alloc(16) is None  # full: None, as SGLang
        assert sorted(torch.cat([a, b]).tolist()) == list(range(144))
        assert host.free(a[:32]) == 32
        assert host.available_size() == 32
        c = host.alloc(32)
        assert sorted(c.tolist()) == sorted(a[:32].tolist())
        host.clear()
        assert host.available_size() == 144
        stats = host.client.get_pool_stats(host.pool_name).pools[0]
        assert stats.used_pages == 0 and stats.free_pages == 9
        with pytest.raises(AssertionError):
            host.alloc(15)
    finally:
        host.close()


def test_bad_input_raises_and_changes_nothing(daemon):
    """Frees as SGLang's HostKVCache.free (pool_host/base.py at 39baee9e):
    token by token, AssertionError ("Double-free detected") for a slot not
    allocated, IndexError outside the pool; nothing freed on bad input."""
    device = DevicePool("mha", LAYERS, size=64, page_size=16)
    host = host_pool_for(daemon, device, "layer_first")
    try:
        idx = host.alloc(32)
        before = host.available_size()
        used = lambda: host.client.get_pool_stats(host.pool_name).pools[0].used_pages
        with pytest.raises(AssertionError, match="Double-free"):
            host.free(torch.cat([idx[:16]] * 2))  # a slot twice in one free
        with pytest.raises(AssertionError, match="not currently allocated"):
            host.free(torch.cat([idx[:4], idx[-1:] + 16]))  # one slot never allocated
        with pytest.raises(IndexError):
            host.free(torch.tensor([10_000] * 16))
        with pytest.raises(ValueError):
            host.free(torch.zeros(2, 2, dtype=torch.int64))
        assert host.available_size() == before and used() == 2
        # Token-granular: half a page frees nothing in hostkvd, the other half does.
        assert host.free(idx[:8]) == 8
        assert used() == 2 and host.available_size() == before
        with pytest.raises(AssertionError, match="not currently allocated"):
            host.free(idx[4:12])  # 4..7 were freed already
        assert host.free(idx[8:16].flip(0)) == 8
        assert used() == 1 and host.available_size() == before + 16
        with pytest.raises(AssertionError, match="not currently allocated"):
            host.free(idx[:16])  # a double free
        assert host.available_size() == before + 16
        with pytest.raises(ValueError, match="Unsupported IO backend"):
            host.backup_from_device_all_layer(device, idx[16:], torch.arange(16), "page")
        with pytest.raises(ValueError, match="host indices but"):
            host.backup_from_device_all_layer(device, idx[16:], torch.arange(15), "kernel")
        with pytest.raises(ValueError, match="outside the device"):
            host.load_to_device_per_layer(device, idx[16:], torch.arange(16) + 1000, 0,
                                          "kernel")
        with pytest.raises(ValueError):
            host.set_from_flat_data_page(int(idx[16]), torch.zeros(3, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="not allocated"):
            host.set_from_flat_data_page(0, host.get_dummy_flat_data_page())
        assert used() == 1
    finally:
        host.close()


@pytest.mark.parametrize("layout", ["layer_first", "page_first_direct"])
def test_set_from_flat_data_page_round_trips(daemon, layout):
    device = DevicePool("mha", LAYERS, size=32, page_size=16)
    host = host_pool_for(daemon, device, layout)
    try:
        idx = host.alloc(16)
        page = torch.randn(host.get_dummy_flat_data_page().shape).to(torch.bfloat16)
        host.set_from_flat_data_page(int(idx[0]), page)
        assert torch.equal(host.get_data_page(int(idx[0])), page)
        # The daemon sees the same bytes (its ReadPages: SGLang's flat page).
        raw = host.client.read_pages(host.pool_name, [(int(idx[0]) // 16, 1)])
        assert raw == page.view(torch.uint8).numpy().tobytes()
        assert int(torch.count_nonzero(host.get_dummy_flat_data_page())) == 0
    finally:
        host.close()


def test_sizing_and_errors_follow_sglang(daemon, caplog):
    """Sizing as pool_host/base.py at 39baee9e: host_page_num pages exactly,
    else ratio x device (+1 page); a pool not larger than the device pool
    is a warning, not an error."""
    device = DevicePool("mha", LAYERS, size=64, page_size=16)
    with caplog.at_level("WARNING", logger="hostkv.sglang"):
        small = host_pool_for(daemon, device, "layer_first", ratio=0.5)
    assert small.size == 48 and small.page_num == 3
    assert "smaller than the device pool" in caplog.text
    small.close()
    exact = RemoteMHATokenToKVPoolHost(device, 2.0, 0, 16, "page_first", True, "cpu",
                                       "default", 9, target=daemon.target)
    assert (exact.page_num, exact.size, exact.available_size()) == (9, 144, 144)
    assert exact.pool.token_slots == 144
    exact.close()
    by_keyword = host_pool_for(daemon, device, "layer_first", host_page_num=5)
    assert by_keyword.size == 80
    by_keyword.close()
    with pytest.raises(ValueError, match="must be positive"):
        host_pool_for(daemon, device, "layer_first", host_page_num=0)
    with pytest.raises(ValueError, match="Unsupported layout"):
        host_pool_for(daemon, DevicePool("mla", LAYERS, 64, 16), "page_head")
    with pytest.raises(ValueError, match="Not enough host memory"):
        # 1 TB of host pool: past the daemon's memory budget.
        RemoteMHATokenToKVPoolHost(device, 0, 1000, 16, "layer_first", target=daemon.target)
    with pytest.raises(NotImplementedError, match="dcp_size"):
        host_pool_for(daemon, device, "layer_first", dcp_size=2)
    with pytest.raises(TypeError):
        RemoteMHATokenToKVPoolHost(device, 2.0, 0, 16, "layer_first", True, "cpu",
                                   "default", 9, 10, target=daemon.target)
    # Older SGLang calls with four arguments (no layout): layer_first.
    old_style = RemoteMLATokenToKVPoolHost(DevicePool("mla", LAYERS, 32, 16), 2.0, 0, 16,
                                           allocator_type="default", target=daemon.target)
    assert old_style.layout == "layer_first" and old_style.kv_buffer.shape[1] == old_style.size
    old_style.close()
    # Nothing is left behind by the failed constructions.
    with hostkv.Client(daemon.target, "observer") as c:
        assert not [p for p in c.list_pools() if p.spec.name.startswith("sglang-")]


def test_private_pool_goes_with_the_engine(daemon):
    device = DevicePool("mla", LAYERS, size=32, page_size=16)
    host = host_pool_for(daemon, device, "page_first")
    name = host.pool_name
    host.alloc(32)
    with hostkv.Client(daemon.target, "observer") as c:
        assert c.get_pool(name).owner.delete_with_session == host.client.session_number
        host.close()
        with pytest.raises(hostkv.errors.NotFound):
            c.get_pool(name)


def test_named_pool_is_shared_and_outlives_the_engine(daemon):
    device = DevicePool("mha", LAYERS, size=32, page_size=16)
    first = host_pool_for(daemon, device, "layer_first", pool_name="shared-llama")
    idx = first.alloc(16)
    device.fill_random(torch.Generator().manual_seed(7))
    first.backup_from_device_all_layer(device, idx, torch.arange(16), "kernel")
    second = host_pool_for(daemon, DevicePool("mha", LAYERS, size=32, page_size=16),
                           "layer_first", pool_name="shared-llama")
    try:
        # One segment, two mappings of it.
        assert second.kv_buffer.data_ptr() != first.kv_buffer.data_ptr()
        assert torch.equal(second.get_data_page(int(idx[0])), first.get_data_page(int(idx[0])))
        assert int(torch.count_nonzero(second.get_data_page(int(idx[0])))) > 0
        first.close()
        with hostkv.Client(daemon.target, "observer") as c:
            assert c.get_pool("shared-llama").spec.name == "shared-llama"
    finally:
        second.close()
        with hostkv.Client(daemon.target, "observer") as c:
            c.delete_pool("shared-llama")


def test_hostkv_pool_names_the_engines_pool(daemon, monkeypatch):
    # SGLANG_HOSTKV=1 builds the pool without pool_name=: HOSTKV_POOL gives
    # it a name, so it (and the pages cached in it) outlives the engine.
    monkeypatch.setenv("HOSTKV_POOL", "env-named")
    device = DevicePool("mha", LAYERS, size=32, page_size=16)
    host = host_pool_for(daemon, device, "page_first")
    assert host.pool_name == "env-named"
    with hostkv.Client(daemon.target, "observer") as c:
        assert c.get_pool("env-named").owner.delete_with_session == 0
        host.close()
        assert c.get_pool("env-named").spec.name == "env-named"
        c.delete_pool("env-named")


def test_cli_shows_who_owns_the_engines_pool(daemon):
    cli = os.environ.get("HOSTKV_CLI")
    if not cli:
        pytest.skip("HOSTKV_CLI does not name the hostkv CLI")
    device = DevicePool("mha", LAYERS, size=32, page_size=16)
    host = host_pool_for(daemon, device, "layer_first")
    try:
        out = subprocess.run([cli, f"--target={daemon.target}", "pools"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
        (row,) = [line for line in out.splitlines() if line.startswith(host.pool_name)]
        assert f"uid {os.getuid()} +session {host.client.session_number}" in row
    finally:
        host.close()
