"""vLLM block hashes as hostkvd cache keys (1..64 bytes). Hashes of up to
64 bytes are the keys themselves; a longer one (older vLLM concatenates the
hashes of the GPU blocks in an offloaded block) is keyed by its SHA-256,
and the hash is remembered so that evictions can be reported as vLLM's
hashes."""
import hashlib

MAX_KEY = 64


class KeyMap:
    def __init__(self):
        self._long = {}  # key -> the hash it stands for, for long hashes

    def key(self, block_hash):
        h = bytes(block_hash)
        if not h:
            raise ValueError("an empty block hash")
        if len(h) <= MAX_KEY:
            return h
        k = hashlib.sha256(b"hostkv.vllm:" + h).digest()
        self._long[k] = h
        return k

    def keys(self, block_hashes):
        return [self.key(h) for h in block_hashes]

    def block_hash(self, key):
        """The vLLM hash of a key the daemon returned."""
        return self._long.get(key, key)
