"""The names HostkvStorage gives things: cache keys, its namespace, its pool.

Keys: SGLang's page keys are 64-character hex SHA-256 strings
(get_hash_str, chained page to page); a str of hex digits of even length
is stored as its bytes (bytes.fromhex: 32 bytes for SGLang's keys), any
other str as its utf-8 bytes, bytes as given. (So "6869" and "hi" name the
same key; SGLang only ever passes hex.)

Namespace: extra_config["namespace"] if given, else derived from
SGLang's HiCacheStorageConfig so that only engines whose pages are
interchangeable share it:

    sglang/<model_name>/tp<rank>-<size>[/pp<rank>-<size>][/cp<rank>-<size>]/p<page_size>/sha256

with "mla" in place of the TP part for rank-replicated KV (MLA: every TP
rank holds the same latent). A model name that would make it longer than
hostkvd's 128 bytes is replaced by the first 32 hex digits of its SHA-256.
"""
import hashlib
import re

from .. import cache_calls, errors

MAX_NAMESPACE_BYTES = 128
MAX_POOL_NAME = 64
_HEX = re.compile(r"[0-9a-fA-F]*")
_POOL_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def storage_key(key, what="key"):
    """The cache key (bytes) of an SGLang page key; InvalidArgument for one
    that is not 1..64 bytes."""
    if isinstance(key, str) and len(key) % 2 == 0 and key and _HEX.fullmatch(key):
        raw = bytes.fromhex(key)
        if len(raw) <= cache_calls.MAX_KEY_BYTES:
            return raw
    return cache_calls.cache_key(key, what)


def derived_namespace(storage_config, page_size):
    """The namespace of engines configured as `storage_config`
    (HiCacheStorageConfig) with pages of `page_size` tokens.

    ValueError without a model name (pages of different models must not
    meet): set extra_config "namespace".
    """
    model = getattr(storage_config, "model_name", None)
    if not model:
        raise ValueError(
            "HostkvStorage: SGLang gave no model name; set \"namespace\" in "
            "--hicache-storage-backend-extra-config")
    parts = ["mla"] if getattr(storage_config, "is_mla_model", False) else [
        f"tp{storage_config.tp_rank}-{storage_config.tp_size}"]
    if getattr(storage_config, "pp_size", 1) > 1:
        parts.append(f"pp{storage_config.pp_rank}-{storage_config.pp_size}")
    if getattr(storage_config, "attn_cp_size", 1) > 1:
        parts.append(f"cp{storage_config.attn_cp_rank}-{storage_config.attn_cp_size}")
    parts += [f"p{page_size}", "sha256"]
    tail = "/".join(parts)
    namespace = f"sglang/{model}/{tail}"
    if len(namespace.encode("utf-8")) > MAX_NAMESPACE_BYTES:
        digest = hashlib.sha256(model.encode("utf-8")).hexdigest()[:32]
        namespace = f"sglang/{digest}/{tail}"
    return namespace


def check_namespace(namespace):
    """`namespace` if it has 1..128 utf-8 bytes, else InvalidArgument."""
    if not isinstance(namespace, str) or not 1 <= len(namespace.encode("utf-8")) <= \
            MAX_NAMESPACE_BYTES:
        raise errors.InvalidArgument(
            f"a namespace is a str of 1..{MAX_NAMESPACE_BYTES} bytes, not {namespace!r}")
    return namespace


def derived_pool_name(kind, dims, dtype_name, layout, page_size):
    """The hostkvd pool of an in-process host pool's geometry, e.g.
    "sglang-cache-mha-32x8x128-bf16-page_first-p64" (dims: layers x heads x
    head_dim; MLA: layers x kv_lora_rank x qk_rope_head_dim)."""
    name = (f"sglang-cache-{kind}-{'x'.join(str(d) for d in dims)}-{dtype_name}-"
            f"{layout}-p{page_size}")
    name = _POOL_CHARS.sub("_", name)
    if len(name) > MAX_POOL_NAME:
        name = "sglang-cache-" + hashlib.sha256(name.encode()).hexdigest()[:32]
    return name
