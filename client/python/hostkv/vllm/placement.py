"""Where a vLLM v0.26+ instance's blocks live in hostkvd: one pool and one
cache namespace per (KV cache group, rank), named from what makes blocks
interchangeable between instances (OffloadingConfig: model, KV dtype, hash
and block sizes of every group, parallel layout; plus the operator's
hostkv_namespace text), never from the instance itself. So every instance
of the same model and layout on the node, each data-parallel replica, and
the same instance after a restart find the same blocks.

Why a pool per group: each group has its own layers and page size (a
hybrid model's sliding-window and full-attention groups), and hostkvd
pages have one geometry per pool. Why a pool per rank: see naming.py (each
worker owns, fills and publishes its own shard).

Nothing here imports vLLM or talks to the daemon.
"""
import hashlib
import re

_MAX_NAMESPACE = 128


def _field(obj, name, default=None):
    return getattr(obj, name, default) if obj is not None else default


class GroupPlacement:
    """Built from an OffloadingConfig (duck-typed: groups, model, cache,
    parallel). `extra`: the operator's namespace text."""

    def __init__(self, config, extra="", pool_prefix="vllm", owner=""):
        groups = tuple(config.groups)
        self.owner = owner  # "uid<N>.": names only this user may take (_owned_names)
        if not groups:
            raise ValueError("the OffloadingConfig has no KV cache groups to offload")
        # The key's group index is OffloadingGroupConfig.group_id where vLLM
        # has it (the KVCacheConfig group index), else the position.
        self.group_ids = tuple(int(_field(g, "group_id", i)) for i, g in enumerate(groups))
        self.positions = {gid: i for i, gid in enumerate(self.group_ids)}
        self.tokens_per_block = tuple(int(g.tokens_per_block) for g in groups)
        parallel = config.parallel
        self.world_size = max(1, int(_field(parallel, "world_size", 1)))
        self.tp = int(_field(parallel, "tp_size", 1))
        self.pp = int(_field(parallel, "pp_size", 1))
        self.pool_prefix = pool_prefix
        model = config.model
        cache = config.cache
        layers = hashlib.sha256(repr([tuple(g.layer_names) for g in groups]).encode())
        fields = [
            f"model={_field(model, 'name', 'model')}", f"kv_dtype={_field(model, 'dtype', '')}",
            f"tokens_per_hash={cache.tokens_per_hash}",
            f"blocks_per_chunk={cache.blocks_per_chunk}",
            "groups=" + ",".join(f"{gid}:{tpb}" for gid, tpb in zip(self.group_ids,
                                                                   self.tokens_per_block)),
            f"layers={layers.hexdigest()[:16]}",
            f"world={self.world_size}", f"tp={self.tp}", f"pp={self.pp}",
            f"pcp={_field(parallel, 'pcp_size', 1)}", f"dcp={_field(parallel, 'dcp_size', 1)}",
            f"extra={extra}"]
        self.descriptor = ";".join(fields)
        self.digest = hashlib.sha256(self.descriptor.encode()).hexdigest()[:24]
        name = str(_field(model, "name", "model")).rstrip("/").split("/")[-1]
        self.readable = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40] or "model"

    def ranks(self):
        return range(self.world_size)

    def pool(self, group_id, rank):
        """[uid<N>.]<prefix>-<digest>-g<group>-r<rank>: one group's blocks of
        one rank."""
        self._check(group_id, rank)
        return f"{self.owner}{self.pool_prefix}-{self.digest[:16]}-g{group_id}-r{rank}"

    def namespace(self, group_id, rank):
        """[uid<N>.]vllm:<model>:tp<T>pp<P>:g<group>:r<rank>:<digest>,
        readable in `hostkv stats`."""
        self._check(group_id, rank)
        name = (f"{self.owner}vllm:{self.readable}:tp{self.tp}pp{self.pp}:g{group_id}:r{rank}:"
                f"{self.digest}")
        assert len(name.encode()) <= _MAX_NAMESPACE
        return name

    def places(self, group_id):
        """[(pool, namespace)] of a group, one per rank in rank order."""
        return [(self.pool(group_id, r), self.namespace(group_id, r)) for r in self.ranks()]

    def _check(self, group_id, rank):
        if group_id not in self.positions:
            raise ValueError(f"KV cache group {group_id} is not offloaded (groups "
                             f"{list(self.group_ids)})")
        if not 0 <= int(rank) < self.world_size:
            raise ValueError(f"rank {rank} is outside the world of {self.world_size}")
