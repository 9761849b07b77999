"""Where blocks are, as hostkv.vllm's scheduler tells its workers. The
spec travels from the scheduler process to every worker inside vLLM's
connector metadata (pickled), so it holds plain data: cache keys, never
page numbers a worker would have to trust (each worker looks its pages up
in its own rank's namespace, which gives it its own references).

medium() is "CPU": the blocks are in host memory, and KV-event consumers
(routers) treat them as the CPU tier.
"""
from vllm.v1.kv_offload.abstract import LoadStoreSpec


class HostkvLoadStoreSpec(LoadStoreSpec):
    """keys: the blocks' cache keys, in request order (one per offloaded
    block); parent: the key of the block before the first, or b""."""

    def __init__(self, keys, parent=b""):
        self.keys = [bytes(k) for k in keys]
        self.parent = bytes(parent)

    @staticmethod
    def medium():
        return "CPU"

    def __len__(self):
        return len(self.keys)

    def __repr__(self):
        return f"HostkvLoadStoreSpec({len(self.keys)} blocks)"
