"""Stand-in of python/sglang/srt/mem_cache/utils.get_hash_str as
managers/cache_controller.py @001067ff calls it:
get_hash_str(token_ids, last_hash, page_size=page_size) -> one key per
whole page. SGLang's page key: SHA-256 over the previous page's key (its
32 bytes, hex-decoded; nothing for the first page) and then each token id
as 4 bytes little-endian unsigned (a tuple token, EAGLE's bigram, as each
of its elements); the hex digest. Without page_size: the key of
token_ids as one page (the older one-page form)."""
import hashlib


def _page_key(token_ids, prior_hash):
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for token in token_ids:
        for part in (token if isinstance(token, tuple) else (token,)):
            hasher.update(int(part).to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def get_hash_str(token_ids, prior_hash=None, page_size=None):
    if page_size is None:
        return _page_key(token_ids, prior_hash)
    keys = []
    whole = len(token_ids) - len(token_ids) % page_size
    for start in range(0, whole, page_size):
        prior_hash = _page_key(token_ids[start:start + page_size], prior_hash)
        keys.append(prior_hash)
    return keys


def get_storage_hash_str(token_ids, prior_hash=None, page_size=None):
    """unified_cache_linker.py @03205d15 keys a tail with this: the same
    chain as get_hash_str when the request carries no extra_key/cache_salt
    (SGLang then seeds the chain from them; the stand-in's requests carry
    none)."""
    return get_hash_str(token_ids, prior_hash, page_size=page_size)
