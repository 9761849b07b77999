"""The host-pool methods and keywords SGLang's current code uses beyond
alloc/free/load/backup, checked against SGLang's own definitions (read
from sgl-project/sglang: pool_host/base.py and pool_host/mha.py at
39baee9e09735ebb7916f64ceb00dbfe395ab52b, pool_host/mla.py at
c76318764f51e77e13f6f37ce271232485a8708c, mem_cache/l2_transfer.py at
67e863cd and 086fe1aa): keywords the L2 transfer engines pass, the newer
engine's prepare_transfer_indices / *_physical calls, destroy,
is_stride_page_aligned, get_split_heads_page_buffer_meta,
get_contiguous_buf_infos, override_kv_cache_dim, head_dim != v_head_dim,
and asynchronous submission."""
import ctypes
import logging

import pytest

torch = pytest.importorskip("torch")

import hostkv  # noqa: E402
from hostkv.sglang import (RemoteMHATokenToKVPoolHost,  # noqa: E402
                           RemoteMLATokenToKVPoolHost)

from conftest import Daemon  # noqa: E402
from sglang_model import DevicePool, HostModel  # noqa: E402

LAYERS = 3


def _fill(device, seed=1):
    device.fill_random(torch.Generator().manual_seed(seed))


def _planes_equal(device, expected, slots):
    return all(torch.equal(t[slots], e[slots])
               for layers, exp in zip(device.planes(), expected)
               for t, e in zip(layers, exp))


@pytest.mark.parametrize("async_submit", [False, True])
def test_transfers_take_the_engines_keywords(daemon, async_submit, caplog):
    device = DevicePool("mha", LAYERS, size=64, page_size=16)
    host = RemoteMHATokenToKVPoolHost(device, 2.0, 0, 16, "page_first",
                                      target=daemon.target, async_submit=async_submit)
    try:
        _fill(device)
        idx = host.alloc(32)
        slots = torch.arange(8, 40)
        want = [[t.clone() for t in layers] for layers in device.planes()]
        with caplog.at_level(logging.WARNING, logger="hostkv.sglang"):
            host.backup_from_device_all_layer(device, idx, slots, "kernel",
                                              **{f"future_keyword_{async_submit}": 1})
        assert f"future_keyword_{async_submit}" in caplog.text
        device.zero()
        # The newer L2 engine: indices prepared once, then the physical calls.
        h, d = host.prepare_transfer_indices(idx, slots, "kernel")
        assert h is idx and d is slots
        for layer in range(LAYERS):
            host.load_to_device_per_layer_physical(device, h, d, layer, "kernel",
                                                   is_draft=False)
        assert _planes_equal(device, want, slots)
        device.zero()
        for layer in range(LAYERS):  # the 67e863cd engine's keywords
            host.load_to_device_per_layer(device, idx, slots, layer, "kernel",
                                          is_draft=False)
        assert _planes_equal(device, want, slots)
        with pytest.raises(NotImplementedError, match="is_draft"):
            host.load_to_device_per_layer(device, idx, slots, 0, "kernel", is_draft=True)
    finally:
        host.close()


def test_asynchronous_submission_reports_errors_at_the_wait(daemon):
    device = DevicePool("mla", LAYERS, size=32, page_size=16)
    host = RemoteMLATokenToKVPoolHost(device, 2.0, 0, 16, "layer_first",
                                      target=daemon.target, async_submit=True)
    try:
        idx = host.alloc(16)
        with pytest.raises(ValueError, match="outside the device"):
            host.backup_from_device_all_layer(device, idx, torch.arange(16) + 100, "kernel")
        _fill(device)
        want = [[t.clone() for t in layers] for layers in device.planes()]
        host.backup_from_device_all_layer(device, idx, torch.arange(16), "kernel")
        device.zero()
        for layer in range(LAYERS):
            host.load_to_device_per_layer(device, idx, torch.arange(16), layer, "kernel")
        assert _planes_equal(device, want, torch.arange(16))
        host.drain_submissions()
    finally:
        host.close()


def test_destroy_is_idempotent_and_ends_the_session(daemon):
    device = DevicePool("mha", LAYERS, size=32, page_size=16)
    host = RemoteMHATokenToKVPoolHost(device, 2.0, 0, 16, "layer_first", target=daemon.target)
    name = host.pool_name
    host.alloc(16)
    host.destroy()
    host.destroy()
    assert host.kv_buffer is None
    with hostkv.Client(daemon.target, "observer") as c:
        with pytest.raises(hostkv.errors.NotFound):
            c.get_pool(name)


def _read(ptr, size):
    return ctypes.string_at(ptr, size)


@pytest.mark.parametrize("split", [1, 2, 4])
def test_split_heads_page_buffer_meta_points_at_sglangs_bytes(daemon, split):
    device = DevicePool("mha", LAYERS, size=64, page_size=16, head_num=4, head_dim=8)
    host = RemoteMHATokenToKVPoolHost(device, 2.0, 0, 16, "page_head", target=daemon.target)
    try:
        _fill(device, 7)
        idx = host.alloc(32)
        slots = torch.arange(32)
        host.backup_from_device_all_layer(device, idx, slots, "kernel")
        model = HostModel("mha", "page_head", LAYERS, host.size, 16, (4, 8), device.dtype)
        model.backup(device, idx, slots)
        ptrs, sizes = host.get_split_heads_page_buffer_meta(idx, split)
        assert len(ptrs) == 2 * split * 2 and set(sizes) == {LAYERS * 2 * 16 * 4 * 8 // split}
        heads = 4 // split
        i = 0
        for page in idx[::16].tolist():
            p = page // 16
            for head in range(0, 4, heads):
                for plane in (0, 1):
                    want = model.buf[plane, p, head:head + heads].contiguous()
                    assert _read(ptrs[i], sizes[i]) == want.view(torch.uint8).numpy().tobytes()
                    i += 1
        assert host.is_stride_page_aligned(64) == (host.page_size * host.layout_dim % 64 == 0)
    finally:
        host.close()


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_contiguous_buf_infos_as_sglangs_mla_pool(daemon, layout):
    device = DevicePool("mla", LAYERS, size=32, page_size=16)
    host = RemoteMLATokenToKVPoolHost(device, 2.0, 0, 16, layout, target=daemon.target)
    try:
        ptrs, lens, items = host.get_contiguous_buf_infos()
        kv = host.kv_buffer
        row = host.token_stride_size
        if layout == "layer_first":
            assert ptrs == [kv.data_ptr() + i * host.size * row for i in range(LAYERS)]
            assert lens == [host.size * row] * LAYERS
        else:  # SGLang's kv_buffer[i] of page_first is token i's row of every layer
            assert ptrs == [kv.data_ptr() + i * row for i in range(LAYERS)]
            assert lens == [LAYERS * row] * LAYERS
        assert items == [row * 16] * LAYERS
        assert host.is_stride_page_aligned() is (layout != "layer_first"
                                                 and kv.data_ptr() % 4096 == 0
                                                 and 16 * host.layout_dim % 4096 == 0)
    finally:
        host.close()


def test_override_kv_cache_dim_sets_the_latent_width(daemon):
    """DSA/NSA models: MLATokenToKVPoolHost(..., override_kv_cache_dim=656),
    uint8 rows of 656 bytes, not kv_lora_rank + qk_rope_head_dim."""
    device = DevicePool("mla", LAYERS, size=32, page_size=16, dtype=torch.bfloat16,
                        kv_lora_rank=16, qk_rope_head_dim=8)
    wide = DevicePool.__new__(DevicePool)  # the same device pool, rows of 40
    wide.__dict__.update(device.__dict__)
    wide.kv, wide.kv_buffer = hostkv.torch.mla_kv_buffer(LAYERS, 48, 40, torch.bfloat16)
    host = RemoteMLATokenToKVPoolHost(wide, 2.0, 0, 16, "page_first", True, "cpu",
                                      "default", 40, target=daemon.target)
    try:
        assert host.kv_cache_dim == 40 and host.size_per_token == 40 * 2 * LAYERS
        assert host.pool.bytes_per_token == host.size_per_token
        assert host.kv_buffer.shape == (host.size, LAYERS, 1, 40)
        assert host.get_dummy_flat_data_page().numel() == 16 * LAYERS * 40
        _fill(wide, 3)
        idx = host.alloc(16)
        want = [t[:16].clone() for t in wide.kv_buffer]
        host.backup_from_device_all_layer(wide, idx, torch.arange(16), "kernel")
        wide.zero()
        for layer in range(LAYERS):
            host.load_to_device_per_layer(wide, idx, torch.arange(16), layer, "kernel")
        assert all(torch.equal(t[:16], w) for t, w in zip(wide.kv_buffer, want))
    finally:
        host.close()


def test_different_k_and_v_head_widths_are_refused(daemon):
    device = DevicePool("mha", LAYERS, size=32, page_size=16)
    device.v_head_dim = device.head_dim * 2
    with pytest.raises(NotImplementedError, match="v_head_dim"):
        RemoteMHATokenToKVPoolHost(device, 2.0, 0, 16, "page_first", target=daemon.target)


def test_a_per_user_pool_limit_is_named():
    d = Daemon("--max_pools_per_uid=1")
    try:
        device = DevicePool("mha", LAYERS, size=32, page_size=16)
        first = RemoteMHATokenToKVPoolHost(device, 2.0, 0, 16, "layer_first", target=d.target)
        try:
            with pytest.raises(hostkv.errors.ResourceExhausted,
                               match="--max_pools_per_uid") as e:
                RemoteMHATokenToKVPoolHost(device, 2.0, 0, 16, "layer_first",
                                           target=d.target)
            assert "host memory" not in str(e.value)
        finally:
            first.close()
    finally:
        d.stop()


def test_storage_format_tag_is_sglangs_own_pages():
    # Newer controllers append a host pool's storage_format_tag to the
    # storage model name (cache_controller.storage_model_name); hostkv's
    # pools hold SGLang's own layouts, so the tag is None as on SGLang's.
    assert RemoteMHATokenToKVPoolHost.storage_format_tag is None
    assert RemoteMLATokenToKVPoolHost.storage_format_tag is None
