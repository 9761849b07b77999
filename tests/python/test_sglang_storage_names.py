"""HostkvStorage's names: SGLang keys -> cache keys, the derived namespace,
the derived pool name (no daemon needed)."""
import hashlib

import pytest

from hostkv import errors
from hostkv.sglang import storage_names

from sglang_model import page_keys
from storage_fixtures import StorageConfig


def test_sglang_keys_are_chained_sha256_of_little_endian_token_ids():
    keys = page_keys([1, 2, 3, 4, 5], page_size=2)  # the last, partial page has no key
    first = hashlib.sha256(b"\x01\x00\x00\x00\x02\x00\x00\x00").hexdigest()
    second = hashlib.sha256(bytes.fromhex(first) + b"\x03\x00\x00\x00\x04\x00\x00\x00")
    assert keys == [first, second.hexdigest()]
    assert page_keys([3, 4], 2, prior_hash=first) == keys[1:]


def test_storage_keys():
    key = page_keys(list(range(16)), 16)[0]
    assert storage_names.storage_key(key) == bytes.fromhex(key)
    assert len(storage_names.storage_key(key)) == 32
    assert storage_names.storage_key("not-hex") == b"not-hex"
    assert storage_names.storage_key("abc") == b"abc"  # odd length: utf-8
    assert storage_names.storage_key(b"\x00raw") == b"\x00raw"
    for bad in ("", "x" * 65, "ab" * 65, 12):
        with pytest.raises(errors.InvalidArgument):
            storage_names.storage_key(bad)


def test_derived_namespaces():
    derive = storage_names.derived_namespace
    assert derive(StorageConfig(model_name="m"), 64) == "sglang/m/tp0-1/p64/sha256"
    assert derive(StorageConfig(model_name="m", tp_rank=3, tp_size=8, pp_rank=1, pp_size=2,
                                attn_cp_rank=0, attn_cp_size=2), 16) == \
        "sglang/m/tp3-8/pp1-2/cp0-2/p16/sha256"
    assert derive(StorageConfig(model_name="m", tp_rank=5, tp_size=8, is_mla_model=True),
                  1) == "sglang/m/mla/p1/sha256"
    long = derive(StorageConfig(model_name="org/" + "x" * 200), 64)
    digest = hashlib.sha256(("org/" + "x" * 200).encode()).hexdigest()[:32]
    assert long == f"sglang/{digest}/tp0-1/p64/sha256" and len(long) <= 128
    with pytest.raises(ValueError, match="namespace"):
        derive(StorageConfig(model_name=None), 64)
    with pytest.raises(errors.InvalidArgument):
        storage_names.check_namespace("n" * 129)


def test_derived_pool_names_fit_hostkvd():
    name = storage_names.derived_pool_name("mha", (32, 8, 128), "bf16", "page_first_direct", 64)
    assert name == "sglang-cache-mha-32x8x128-bf16-page_first_direct-p64"
    long = storage_names.derived_pool_name("mla", (10 ** 12, 10 ** 12, 10 ** 12), "fp8_e4m3",
                                           "page_first_direct", 10 ** 9)
    assert len(long) <= 64 and long.startswith("sglang-cache-")
