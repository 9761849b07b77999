"""Backup then load through hostkvd with torch tensors in sealed shared memory."""
import pytest

torch = pytest.importorskip("torch")

import hostkv  # noqa: E402
import hostkv.torch as hkt  # noqa: E402

PAGE = 4
LAYERS = 3
DEVICE_TOKENS = 32
SLOTS = DEVICE_TOKENS + PAGE
CASES = [
    ("mha", "page_first"), ("mha", "layer_first"),
    ("mla", "page_first"), ("mla", "layer_first"),
    ("mha", "page_first_direct"), ("mla", "page_first_direct"), ("mha", "page_head"),
]


def make_pool(client, attention, layout):
    name = f"rt-{attention}-{layout}"
    if attention == "mha":
        spec = hostkv.mha_pool_spec(name, num_layers=LAYERS, num_kv_heads=2, head_dim=8,
                                    page_size=PAGE, layout=layout, capacity_tokens=64)
        kv, k, v = hkt.mha_kv_buffer(LAYERS, SLOTS, 2, 8, torch.bfloat16)
    else:
        spec = hostkv.mla_pool_spec(name, num_layers=LAYERS, kv_lora_rank=16,
                                    qk_rope_head_dim=8, page_size=PAGE, layout=layout,
                                    capacity_tokens=64)
        kv, k = hkt.mla_kv_buffer(LAYERS, SLOTS, 24, torch.bfloat16)
        v = []
    pool = client.create_pool(spec)
    return pool, kv, k, v


def is_zero(t):
    return bool(torch.all(t == 0))


def token_axis(attention):
    return 2 if attention == "mha" else 1


def rows(kv, attention, first, count):
    return kv.narrow(token_axis(attention), first, count)


@pytest.mark.parametrize("mechanism", [hostkv.pb.MECHANISM_KERNEL, hostkv.pb.MECHANISM_DIRECT])
@pytest.mark.parametrize("attention,layout", CASES)
def test_backup_zero_load_layer_by_layer(client, attention, layout, mechanism):
    pool, kv, k, v = make_pool(client, attention, layout)
    name = pool.spec.name
    kb, vb = hkt.device_buffers_for(client, k, v)
    import_id = client.register_device_buffers(name, SLOTS, kb, vb)
    kv.copy_(torch.randn(kv.shape).to(torch.bfloat16))
    original = kv.clone()

    pages = client.alloc(name, 16)
    assert hostkv.count_tokens(pages, PAGE) == 16
    op = client.backup(name, import_id, pages, [(4, 16)], mechanism=mechanism)
    assert (op.layer_begin, op.num_layers, op.num_tokens) == (0, LAYERS, 16)
    client.wait(op)
    assert len(client.read_pages(name, pages)) == 4 * pool.page_bytes

    kv.zero_()
    op = client.load(name, import_id, pages, [(20, 8), (8, 8)], mechanism=mechanism)
    for layer in range(LAYERS):
        client.wait_layer(op, layer, timeout=10)
    assert torch.equal(rows(kv, attention, 20, 8), rows(original, attention, 4, 8))
    assert torch.equal(rows(kv, attention, 8, 8), rows(original, attention, 12, 8))
    # Nothing else was written.
    assert is_zero(rows(kv, attention, 0, 8)) and is_zero(rows(kv, attention, 16, 4))
    assert is_zero(rows(kv, attention, 28, SLOTS - 28))

    assert client.free(name, pages) == 4
    client.unregister_device_buffers(import_id)
    client.delete_pool(name)


def test_partial_layers(client):
    pool, kv, k, v = make_pool(client, "mha", "page_first")
    name = pool.spec.name
    import_id = client.register_device_buffers(name, SLOTS, *hkt.device_buffers_for(client, k, v))
    kv.copy_(torch.randn(kv.shape).to(torch.bfloat16))
    original = kv.clone()
    pages = client.alloc(name, 8)
    client.wait(client.backup(name, import_id, pages, [(0, 8)]))
    kv.zero_()
    op = client.load(name, import_id, pages, [(0, 8)], layer_begin=1, layer_end=3)
    assert (op.layer_begin, op.num_layers) == (1, 2)
    with pytest.raises(hostkv.errors.InvalidArgument):
        client.wait_layer(op, 0)
    client.wait_layer(op, 2)
    assert torch.equal(kv[:, 1:3, 0:8], original[:, 1:3, 0:8])
    assert is_zero(kv[:, 0])
    client.free(name, pages)
    client.unregister(import_id)
    client.delete_pool(name)


def test_write_pages_then_read_back(client):
    pool = client.create_pool(hostkv.mha_pool_spec(
        "rt-pages", num_layers=2, num_kv_heads=1, head_dim=8, page_size=PAGE,
        capacity_tokens=32))
    pages = client.alloc("rt-pages", 8)
    data = bytes(range(256)) * (2 * pool.page_bytes // 256)
    client.write_pages("rt-pages", pages, data)
    assert client.read_pages("rt-pages", pages) == data
    meta = client.get_page_buffer_meta("rt-pages", pages)
    assert meta.segment_name == pool.segment_name
    assert sum(p.size for p in meta.pieces) == 2 * pool.page_bytes
    client.free("rt-pages", pages)
    client.delete_pool("rt-pages")


@pytest.mark.parametrize("attention,layout", CASES)
def test_pool_view_is_sglangs_kv_buffer(client, attention, layout):
    pool, _, _, _ = make_pool(client, attention, layout)
    name = pool.spec.name
    view = hkt.pool_view(client, name)
    pages = client.alloc(name, 2 * PAGE)
    data = bytes(range(256)) * (2 * pool.page_bytes // 256 + 1)
    client.write_pages(name, pages, data[:2 * pool.page_bytes])
    first = pages[0][0] * PAGE
    # The view's page, flattened in the layout's axis order, is the flat page.
    if layout == "layer_first":
        page = view[:, :, first:first + PAGE] if attention == "mha" else view[:, first:first + PAGE]
    elif layout == "page_first":
        page = view[:, first:first + PAGE] if attention == "mha" else view[first:first + PAGE]
    else:
        p = first // PAGE
        page = view[:, p:p + 1] if attention == "mha" else view[p:p + 1]
    got = page.flatten().view(torch.uint8).numpy().tobytes()
    assert got == client.read_pages(name, [(pages[0][0], 1)])
    client.free(name, pages)
    del view
    client.delete_pool(name)


OUTLIVES = """
import gc, sys, torch, hostkv
c = hostkv.Client(sys.argv[1], "outlives")
c.create_pool(hostkv.mha_pool_spec("outlives", num_layers=1, num_kv_heads=1, head_dim=8,
                                   page_size=4, capacity_tokens=64))
pages = c.alloc("outlives", 4)
c.write_pages("outlives", pages, b"\\x07" * c.get_pool("outlives").page_bytes)
view = c.map_pool("outlives").tensor()  # the PoolMapping itself is dropped here
gc.collect()                            # must not unmap what `view` still shows
print(int(view.sum()))
"""


def test_a_view_keeps_its_pool_mapping(daemon):
    import subprocess, sys  # pylint: disable=import-outside-toplevel,multiple-imports
    out = subprocess.run([sys.executable, "-c", OUTLIVES, daemon.target], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr  # a dropped mapping would fault (SIGSEGV)
    assert int(out.stdout.split()[-1]) == 7 * 4 * 2 * 8 * 2  # 0x07 in every byte of a page
