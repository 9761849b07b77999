"""HostkvStorage (SGLang's HiCacheStorage on hostkvd's page cache) as
SGLang's controller drives it: with SGLang's own in-process host pool and
with hostkv's remote pool; keys as SGLang computes them; bytes compared."""
import dataclasses
import itertools
import threading

import pytest

torch = pytest.importorskip("torch")

import hostkv  # noqa: E402
from hostkv.sglang import storage_names  # noqa: E402

from conftest import Daemon  # noqa: E402
from storage_fixtures import Engine, StorageConfig, tokens_of  # noqa: E402

_runs = itertools.count()
IN_PROCESS = [("mha", "page_first"), ("mha", "layer_first"), ("mha", "page_first_direct"),
              ("mha", "page_head"), ("mla", "page_first"), ("mla", "layer_first"),
              ("mla", "page_first_direct")]
REMOTE = IN_PROCESS  # every layout SGLang implements, on both paths


@pytest.fixture(scope="module")
def daemon():
    """A daemon of this module's own: its tests hold a pool per geometry."""
    d = Daemon("--max_pools_per_uid=64")
    yield d
    d.stop()


def unique(prefix):
    return f"{prefix}-{next(_runs)}"


def model_config(attention="mha", **kw):
    """A config of a model no other test uses (so its own namespace)."""
    return StorageConfig(model_name=unique("org/model"), is_mla_model=attention == "mla",
                         **kw)


def engines(daemon, attention, layout, remote, count=2, **kw):
    """`count` engines of a new model sharing the hostkvd pool of their
    geometry (the module's tests share one pool per geometry)."""
    config = model_config(attention)
    pool = f"{'remote' if remote else 'inproc'}-{attention}-{layout}"
    if kw.get("dtype") is not None:
        pool += f"-{str(kw['dtype']).replace('torch.', '')}"
    return [Engine(daemon, attention, layout, remote=remote, pool_name=pool,
                   config=dataclasses.replace(config), **kw) for _ in range(count)]


@pytest.fixture
def no_page_bytes_over_grpc(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("page bytes went over gRPC")
    for name in ("read_pages", "write_pages"):
        monkeypatch.setattr(hostkv.Client, name, forbidden)


@pytest.mark.parametrize("remote,attention,layout",
                         [(False, a, l) for a, l in IN_PROCESS] +
                         [(True, a, l) for a, l in REMOTE])
def test_set_then_another_engine_gets_identical_bytes(daemon, no_page_bytes_over_grpc,
                                                      remote, attention, layout):
    one, two = engines(daemon, attention, layout, remote)
    try:
        assert one.storage.namespace == two.storage.namespace
        assert one.storage.pool_name == two.storage.pool_name
        idx, keys = one.prefill(tokens_of(1, 5 * 16 + 3), seed=11)
        assert len(keys) == 5 and all(len(k) == 64 for k in keys)
        want = one.page_bytes(idx)
        assert one.storage.batch_set_v1(keys, idx) == [True] * 5
        # The cached pages are copies: the engine's own pages stay its own.
        one.host.free(idx)
        assert two.storage.batch_exists(keys) == 5
        assert all(two.storage.exists(k) for k in keys)
        target = two.host.alloc(5 * 16)
        assert two.page_bytes(target) != want
        assert two.storage.batch_get_v1(keys, target) == [True] * 5
        assert two.page_bytes(target) == want
    finally:
        one.close()
        two.close()


@pytest.mark.parametrize("remote", [False, True])
def test_batch_semantics_follow_sglangs_controller(daemon, remote):
    (engine,) = engines(daemon, "mha", "page_first", remote, count=1)
    s = engine.storage
    try:
        idx, keys = engine.prefill(tokens_of(3, 5 * 16), seed=13)
        want = engine.page_bytes(idx)
        assert s.batch_exists(keys) == 0 and not s.exists(keys[0])
        assert s.batch_set_v1(keys[:3], idx[:3 * 16]) == [True] * 3
        assert s.batch_exists(keys) == 3  # keys from the first
        assert s.batch_exists(keys[1:]) == 2 and s.batch_exists(keys[3:]) == 0
        cached = _cached_pages(engine)
        # Setting what is stored stores nothing new; a longer batch adds the rest.
        assert s.batch_set_v1(keys[:3], idx[:3 * 16]) == [True] * 3
        assert _cached_pages(engine) == cached
        assert s.batch_set_v1(keys, idx) == [True] * 5
        assert _cached_pages(engine) == cached + 2
        # A get loads the stored prefix and says which keys it loaded.
        missing = keys[:2] + [keys[4][::-1]] + keys[3:]
        target = engine.host.alloc(5 * 16)
        before = engine.page_bytes(target)
        assert s.batch_get_v1(missing, target) == [True, True, False, False, False]
        got = engine.page_bytes(target)
        assert got[:2] == want[:2] and got[2:] == before[2:]
        # Nothing stays referenced after a get.
        assert _pool_stats(engine).cache.referenced_pages == 0
        assert s.batch_get_v1([], target[:0]) == [] and s.batch_exists([]) == 0
    finally:
        engine.close()


@pytest.mark.parametrize("remote", [False, True])
def test_bad_input_raises_value_error(daemon, remote):
    (engine,) = engines(daemon, "mha", "layer_first", remote, count=1)
    s = engine.storage
    try:
        idx, keys = engine.prefill(tokens_of(4, 2 * 16), seed=14)
        with pytest.raises(ValueError):
            s.batch_set_v1(keys, idx[:16])  # one page for two keys
        with pytest.raises(ValueError):
            s.batch_get_v1(keys, idx[1:17].repeat(2))  # not whole pages
        with pytest.raises(ValueError):
            s.batch_exists(["x" * 65])  # no key (65 bytes)
        with pytest.raises(ValueError):
            s.batch_set_v1([keys[0], 7], idx)
        assert s.batch_exists(keys) == 0  # nothing stored
    finally:
        engine.close()


@pytest.mark.parametrize("remote", [False, True])
def test_flat_page_calls_round_trip(daemon, remote):
    """SGLang's generic path (no interface_v1): flat pages in and out."""
    one, two = engines(daemon, "mha", "page_first_direct", remote)
    try:
        idx, keys = one.prefill(tokens_of(5, 3 * 16), seed=15)
        pages = [one.host.get_data_page(int(i)) for i in idx[::16].tolist()]
        assert one.storage.batch_set(keys, pages) is True
        assert one.storage.set(keys[0], pages[0]) is True  # stored already
        targets = [one.host.get_dummy_flat_data_page() for _ in keys]
        got = two.storage.batch_get(keys + ["ab" * 32], targets + [None])
        assert [g is t for g, t in zip(got, targets)] == [True] * 3 and got[3] is None
        assert all(torch.equal(g.view(torch.uint8), p.contiguous().view(torch.uint8))
                   for g, p in zip(got, pages))
        fresh = two.storage.get(keys[1])
        assert torch.equal(fresh.view(torch.uint8), pages[1].contiguous().view(torch.uint8))
        assert two.storage.get("cd" * 32) is None
    finally:
        one.close()
        two.close()


def test_two_engines_share_pages_and_store_each_key_once(daemon):
    one, two = engines(daemon, "mha", "page_first", False)
    try:
        tokens = tokens_of(6, 4 * 16)
        idx1, keys = one.prefill(tokens, seed=16)
        idx2, keys2 = two.prefill(tokens, seed=16)  # the same prompt, the same KV
        assert keys == keys2
        assert one.storage.batch_set_v1(keys[:2], idx1[:32]) == [True] * 2
        cached = _cached_pages(one)
        # The second engine stores the whole prompt: only the new pages go in,
        # and its own copies of what was there go back (no page of its session).
        assert two.storage.batch_set_v1(keys, idx2) == [True] * 4
        assert _cached_pages(one) == cached + 2
        stats = _pool_stats(one)
        assert sum(u.pages for u in stats.sessions) == 0
        target = one.host.alloc(4 * 16)
        assert one.storage.batch_get_v1(keys, target) == [True] * 4
        assert one.page_bytes(target) == two.page_bytes(idx2)
    finally:
        one.close()
        two.close()


def test_namespaces_keep_ranks_apart_unless_the_kv_is_replicated(daemon):
    config = model_config("mha")
    rank0 = Engine(daemon, "mha", "page_first", config=dataclasses.replace(config))
    rank1 = Engine(daemon, "mha", "page_first",
                   config=dataclasses.replace(config, tp_rank=1, tp_size=2))
    try:
        assert rank0.storage.namespace == f"sglang/{config.model_name}/tp0-1/p16/sha256"
        assert rank1.storage.namespace == f"sglang/{config.model_name}/tp1-2/p16/sha256"
        idx, keys = rank0.prefill(tokens_of(7, 32), seed=17)
        assert rank0.storage.batch_set_v1(keys, idx) == [True] * 2
        assert rank1.storage.batch_exists(keys) == 0
    finally:
        rank0.close()
        rank1.close()
    mla = model_config("mla")
    ranks = [Engine(daemon, "mla", "page_first",
                    config=dataclasses.replace(mla, tp_rank=r, tp_size=2)) for r in (0, 1)]
    try:
        assert ranks[0].storage.namespace == ranks[1].storage.namespace == \
            f"sglang/{mla.model_name}/mla/p16/sha256"
        idx, keys = ranks[0].prefill(tokens_of(8, 32), seed=18)
        assert ranks[0].storage.batch_set_v1(keys, idx) == [True] * 2
        assert ranks[1].storage.batch_exists(keys) == 2
    finally:
        for r in ranks:
            r.close()


@pytest.mark.parametrize("remote", [False, True])
def test_fp8_kv_kept_as_uint8(daemon, remote):
    """SGLang keeps fp8 KV as uint8: a pool of fp8 pages, copied as bytes."""
    one, two = engines(daemon, "mla", "page_first", remote, dtype=torch.uint8)
    try:
        idx, keys = one.prefill(tokens_of(10, 3 * 16), seed=20)
        want = one.page_bytes(idx)
        assert one.storage.batch_set_v1(keys, idx) == [True] * 3
        target = two.host.alloc(3 * 16)
        assert two.storage.batch_get_v1(keys, target) == [True] * 3
        assert two.page_bytes(target) == want and any(any(b) for b in want)
    finally:
        one.close()
        two.close()


def test_namespace_from_the_extra_config(daemon):
    engine = Engine(daemon, "mha", "page_first", namespace="team-a/llama")
    try:
        assert engine.storage.namespace == "team-a/llama"
    finally:
        engine.close()
    with pytest.raises(ValueError, match="namespace"):
        Engine(daemon, "mha", "page_first", config=StorageConfig(model_name=None))


def _pool_stats(engine):
    (s,) = engine.storage.client.get_pool_stats(engine.storage.pool_name).pools
    return s


def _cached_pages(engine):
    return _pool_stats(engine).cached_pages


def test_buffer_only_mode_sizes_the_node_cache_beyond_the_staging_pool(daemon, monkeypatch):
    """--hicache-host-memory-mode buffer_only: the engine's host pool is a
    staging buffer; hostkvd's pool is buffer_only_ratio (8) times it, or
    pool_tokens exactly, so the node cache outgrows the buffer."""
    from hostkv.sglang import storage as storage_module
    monkeypatch.setattr(storage_module, "_host_memory_mode", lambda: "buffer_only")
    engine = Engine(daemon, "mha", "page_first", config=model_config("mha"),
                    pool_name=unique("staged"))
    try:
        pool = engine.storage.client.get_pool(engine.storage.pool_name)
        assert pool.token_slots >= 8 * engine.host.size
        # More pages than the staging pool holds stay cached in hostkvd.
        pages = engine.host.size // 16
        stored = 0
        for round_ in range(3):
            idx, keys = engine.prefill(tokens_of(100 + round_, 16 * 16), seed=round_)
            assert all(engine.storage.batch_set_v1(keys, idx))
            engine.host.free(idx)
            stored += len(keys)
        assert _cached_pages(engine) == stored > pages
    finally:
        engine.close()
    monkeypatch.setattr(storage_module, "_host_memory_mode", lambda: "cache")
    engine = Engine(daemon, "mha", "page_first", config=model_config("mha"),
                    pool_name=unique("cache-mode"))
    try:
        pool = engine.storage.client.get_pool(engine.storage.pool_name)
        assert pool.token_slots < 2 * engine.host.size  # sized like the host pool
    finally:
        engine.close()


def test_a_full_pool_answers_false_and_the_threads_live_on(daemon):
    """hostkvd's refusals are misses, not exceptions: SGLang's storage
    threads would die of one. A pool of 3 pages cannot take 5 at once."""
    engine = Engine(daemon, "mha", "page_first", config=model_config("mha"),
                    pool_name=unique("tiny"), pool_tokens=2 * 16)
    s = engine.storage
    try:
        idx, keys = engine.prefill(tokens_of(9, 5 * 16), seed=19)
        assert s.batch_set_v1(keys, idx) == [False] * 5
        assert s.batch_exists(keys) == 0
        assert s.batch_set_v1(keys[:3], idx[:3 * 16]) == [True] * 3
        # Two more do not fit beside three that are referenced by a get in flight.
        raw = [storage_names.storage_key(k) for k in keys[:3]]
        assert raw[0] == bytes.fromhex(keys[0]) and len(raw[0]) == 32
        hits, held = s.client.lookup(s.pool_name, s.namespace, raw, acquire=True)
        assert hits == 3
        assert s.batch_set_v1(keys, idx) == [True] * 3 + [False] * 2
        s.client.release(s.pool_name, held)
        # Unreferenced, the old pages are evicted for new ones.
        assert s.batch_set_v1(keys[3:], idx[3 * 16:]) == [True] * 2
        assert s.batch_exists(keys[3:]) == 2
    finally:
        engine.close()


def test_prefetch_and_backup_threads_at_once(daemon):
    """SGLang's prefetch, prefetch-I/O and backup threads call one storage
    concurrently; every page comes back with its own bytes."""
    (engine,) = engines(daemon, "mha", "layer_first", False, count=1)
    s = engine.storage
    prompts = []
    for seed in range(4):
        idx, keys = engine.prefill(tokens_of(100 + seed, 2 * 16), seed=100 + seed)
        prompts.append((idx, keys, engine.page_bytes(idx)))
    failures = []

    def backup(idx, keys):
        try:
            for _ in range(5):
                assert s.batch_set_v1(keys, idx) == [True, True]
        except Exception as e:  # pylint: disable=broad-except
            failures.append(e)

    def prefetch(keys, want):
        try:
            for _ in range(20):
                if s.batch_exists(keys) == 2:
                    target = engine.host.alloc(32)
                    assert s.batch_get_v1(keys, target) == [True, True]
                    assert engine.page_bytes(target) == want
                    engine.host.free(target)
        except Exception as e:  # pylint: disable=broad-except
            failures.append(e)

    threads = [threading.Thread(target=backup, args=(idx, keys)) for idx, keys, _ in prompts]
    threads += [threading.Thread(target=prefetch, args=(keys, want))
                for _, keys, want in prompts]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        assert all(s.batch_exists(keys) == 2 for _, keys, _ in prompts)
    finally:
        engine.close()


def test_remote_copies_go_in_calls_of_bounded_size(daemon, monkeypatch):
    """CopyPages calls stay under hostkvd's --max_copy_bytes: a batch is
    split, and every page still lands where it belongs."""
    from hostkv.sglang import storage_paths  # pylint: disable=import-outside-toplevel
    one, two = engines(daemon, "mha", "page_first", True)
    calls = []
    real = hostkv.Client.copy_pages

    def counting(self, pool, from_pages, to_pages):
        calls.append(sum(n for _, n in from_pages))
        return real(self, pool, from_pages, to_pages)

    monkeypatch.setattr(hostkv.Client, "copy_pages", counting)
    monkeypatch.setattr(storage_paths, "COPY_CALL_BYTES", 2 * one.host.pool.page_bytes)
    try:
        idx, keys = one.prefill(tokens_of(11, 5 * 16), seed=21)
        want = one.page_bytes(idx)
        assert one.storage.batch_set_v1(keys, idx) == [True] * 5
        assert calls == [2, 2, 1]
        target = two.host.alloc(5 * 16)
        assert two.storage.batch_get_v1(keys, target) == [True] * 5
        assert calls[3:] == [2, 2, 1]
        assert two.page_bytes(target) == want
    finally:
        one.close()
        two.close()


def test_sglangs_shm_allocator_memfd_cannot_be_sealed_so_pages_are_copied(daemon, caplog):
    """SGLang's shm allocator makes its memfd with MFD_CLOEXEC only
    (mmap_allocator.py alloc_shm @13e4fbf9): no one can seal it against
    shrinking, which hostkvd requires of every segment it maps. The storage
    says so and copies, as with any allocator."""
    import errno
    import fcntl
    import logging
    import os
    import types
    fd = os.memfd_create("sglang_host_pool_test", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 1 << 16)
        with pytest.raises(OSError) as e:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        assert e.value.errno == errno.EPERM
        engine = Engine(daemon, "mha", "page_first", config=model_config("mha"),
                        pool_name=unique("shm-alloc"))
        try:
            engine.host.allocator = types.SimpleNamespace(fds=[fd])
            with caplog.at_level(logging.INFO, logger="hostkv.sglang"):
                engine.storage.register_mem_pool_host(engine.host)
            assert "MFD_ALLOW_SEALING" in caplog.text
            idx, keys = engine.prefill(tokens_of(77, 2 * 16), seed=7)
            assert all(engine.storage.batch_set_v1(keys, idx))  # copied: still stored
        finally:
            engine.close()
    finally:
        os.close(fd)
