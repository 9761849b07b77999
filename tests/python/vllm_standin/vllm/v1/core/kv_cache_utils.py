"""Stand-in of the block-hash parts of vllm/v1/core/kv_cache_utils.py
(facts: the init_none_hash excerpt found in the public index, and the
OffloadingConnector's use of BlockHashListWithBlockSize in
distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py at
0072b0b7443bdddf17824c78d4feae8e1fc12fb4).

- BlockHash is bytes (a NewType). The hash of block i is
  hash_fn((hash of block i-1, tuple(token ids of block i), extra_keys)),
  block 0 chaining from NONE_HASH. extra_keys carry LoRA name, multimodal
  identifiers, cache_salt (None when there are none).
- NONE_HASH is 32 random bytes per process unless PYTHONHASHSEED is set,
  then hash_fn(PYTHONHASHSEED): two vLLM processes share hashes only with
  the same PYTHONHASHSEED.
- The "sha256" algorithm here is SHA-256 over a pickle of the tuple (as
  vLLM's default); the stand-in does not claim byte equality with vLLM's
  hashes: a spec must treat hashes as opaque bytes.
- BlockHashList(hashes, hash_block_size, target_block_size) gives one hash
  per offloaded block. Upstream changed the rule: older versions
  concatenate the factor consecutive hashes, newer ones take the last
  one. The stand-in concatenates (both are opaque, prefix-unique bytes).
"""
import hashlib
import os
import pickle
from typing import NewType

BlockHash = NewType("BlockHash", bytes)


def sha256(obj) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def get_hash_fn_by_name(name: str):
    if name in ("sha256", "sha256_cbor"):
        return sha256
    raise ValueError(f"unsupported hash algorithm in the stand-in: {name}")


def none_hash(hash_fn=sha256) -> BlockHash:
    seed = os.getenv("PYTHONHASHSEED")
    return BlockHash(os.urandom(32) if seed is None else hash_fn(seed))


def hash_block_tokens(hash_fn, parent: bytes, token_ids, extra_keys=None) -> BlockHash:
    return BlockHash(hash_fn((parent, tuple(token_ids), extra_keys)))


def request_block_hashes(token_ids, block_size, hash_fn=sha256, seed=None, extra_keys=None):
    """Chained hashes of the full blocks of token_ids (a partial tail block
    has none), as vLLM's request block hasher computes them."""
    parent = seed if seed is not None else none_hash(hash_fn)
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(hash_fn, parent, token_ids[start:start + block_size],
                                   extra_keys)
        hashes.append(parent)
    return hashes


class BlockHashListWithBlockSize:
    """Hashes at hash_block_size regrouped to target_block_size (a multiple)."""

    def __init__(self, block_hashes, hash_block_size, target_block_size):
        assert target_block_size % hash_block_size == 0
        self.block_hashes = block_hashes
        self.factor = target_block_size // hash_block_size

    def __len__(self):
        return len(self.block_hashes) // self.factor

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return [self[i] for i in range(*idx.indices(len(self)))]
        if idx < 0:
            idx += len(self)
        if not 0 <= idx < len(self):
            raise IndexError(idx)
        base = idx * self.factor
        return BlockHash(b"".join(self.block_hashes[base:base + self.factor]))

    def __iter__(self):
        return (self[i] for i in range(len(self)))
