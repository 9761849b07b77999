"""Where an instance's blocks live in hostkvd: one pool and one cache
namespace per rank, named from the model and the parallel layout only, so
that every instance of the same model and layout on the node (and the same
instance after a restart) finds the same blocks.

Why one pool per rank ("apart"): each rank's worker is its own process and
hostkv session; it allocates, fills and publishes the pages of its own
shard, so no session ever writes pages another owns, and a killed worker
leaves only its own unpublished pages behind, which the daemon frees. A
block is usable when every rank holds its shard; the scheduler's lookup
takes the shortest run over the ranks. The price: the scheduler asks each
rank's namespace (world_size calls per lookup), and a block whose shard was
evicted on one rank is a miss while the other shards wait for eviction.

Nothing here imports vLLM or talks to the daemon.
"""
import hashlib
import re

# Namespaces are at most 128 bytes, pool names 64 of [A-Za-z0-9_.-].
_MAX_NAMESPACE = 128


def _dtype_name(dtype):
    if dtype is None:
        return "auto"
    return str(dtype).replace("torch.", "")


class InstanceLayout:
    """What makes two vLLM instances' KV blocks interchangeable: the model
    (path or name, revision), the KV cache dtype, the prefix-cache hash
    algorithm, the block sizes (hash, GPU, offloaded), the tensor and
    pipeline parallel sizes, and an operator's `extra` text (e.g. a weights
    version). The rank is added per pool/namespace."""

    def __init__(self, model, revision, kv_dtype, hash_algo, hash_block_size,
                 gpu_block_size, offloaded_block_size, tensor_parallel_size,
                 pipeline_parallel_size, extra="", pool_prefix="vllm", owner=""):
        self.world_size = int(tensor_parallel_size) * int(pipeline_parallel_size)
        self.pool_prefix = pool_prefix
        self.owner = owner  # "uid<N>.": names only this user may take (_owned_names)
        fields = [
            f"model={model}", f"revision={revision or ''}", f"kv_dtype={kv_dtype}",
            f"hash={hash_algo}", f"blocks={hash_block_size}/{gpu_block_size}/"
            f"{offloaded_block_size}", f"tp={tensor_parallel_size}",
            f"pp={pipeline_parallel_size}", f"extra={extra}"]
        self.descriptor = ";".join(fields)
        self.digest = hashlib.sha256(self.descriptor.encode()).hexdigest()[:24]
        readable = re.sub(r"[^A-Za-z0-9_.-]", "_", str(model).rstrip("/").split("/")[-1])[:40]
        self.readable = readable or "model"
        self.tensor_parallel_size = int(tensor_parallel_size)
        self.pipeline_parallel_size = int(pipeline_parallel_size)

    @classmethod
    def of(cls, vllm_config, gpu_block_size, offloaded_block_size, extra="",
           pool_prefix="vllm", owner=""):
        model = vllm_config.model_config
        cache = vllm_config.cache_config
        parallel = vllm_config.parallel_config
        kv_dtype = getattr(cache, "cache_dtype", "auto")
        if kv_dtype in (None, "auto"):
            kv_dtype = _dtype_name(getattr(model, "dtype", None))
        return cls(getattr(model, "model", "model"), getattr(model, "revision", None),
                   kv_dtype, getattr(cache, "prefix_caching_hash_algo", "sha256"),
                   cache.block_size, gpu_block_size, offloaded_block_size,
                   getattr(parallel, "tensor_parallel_size", 1),
                   getattr(parallel, "pipeline_parallel_size", 1), extra, pool_prefix, owner)

    def namespace(self, rank):
        """The cache namespace of one rank's blocks, readable in `hostkv
        stats`: vllm:<model>:tp<T>pp<P>:r<rank>:<digest of everything>."""
        self._check_rank(rank)
        name = (f"{self.owner}vllm:{self.readable}:tp{self.tensor_parallel_size}"
                f"pp{self.pipeline_parallel_size}:r{rank}:{self.digest}")
        assert len(name.encode()) <= _MAX_NAMESPACE
        return name

    def pool(self, rank):
        """The pool of one rank's blocks: <prefix>-<digest>-r<rank>."""
        self._check_rank(rank)
        return f"{self.owner}{self.pool_prefix}-{self.digest[:16]}-r{rank}"

    def ranks(self):
        return range(self.world_size)

    def _check_rank(self, rank):
        if not 0 <= int(rank) < self.world_size:
            raise ValueError(f"rank {rank} is outside the world of {self.world_size}")
