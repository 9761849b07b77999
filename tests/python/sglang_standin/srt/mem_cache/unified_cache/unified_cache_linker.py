"""Stand-in of the contract in
python/sglang/srt/mem_cache/unified_cache/unified_cache_linker.py at
sgl-project/sglang 03205d15 (read_file id 71431584660; the abstract class is
the same at 2786aa58, id 57385909257): UnifiedCacheLinker, the transport a
backend implements, with its eleven abstract methods and the duck-typed
layer_done_counter (set_consumer(int), wait_until(int)). No constructor:
whoever builds the linker fixes it (linker_factory.py). The tree-side
wrapper of that file (UnifiedCacheLinkerWrapper: match -> lookup with a
MIN all-reduce over ranks, load_back -> load of the adopted pages,
offload_nodes -> offload, check_hicache_events -> completion polling) is
modelled by tests/python/sglang_linker_driver.py, since it needs SGLang's
radix tree."""
from abc import ABC, abstractmethod


class UnifiedCacheLinker(ABC):
    layer_done_counter: object

    @abstractmethod
    def lookup(self, rid, transfers):
        """Every prefix length (pages of the tail) restorable in all pools;
        local to this rank (the tree intersects the sets across ranks)."""

    @abstractmethod
    def load(self, rid, transfers):
        """Queue a load into the given device indices (run by the next
        start_layer_wise_loading); False makes the wrapper raise."""

    @abstractmethod
    def start_layer_wise_loading(self):
        """Start queued loads; the layer-counter consumer index."""

    @abstractmethod
    def cancel_queued_load(self, rid):
        """Cancel a load that has not started yet."""

    @abstractmethod
    def num_completed_loads(self):
        """Completed load batches waiting to be consumed."""

    @abstractmethod
    def pop_completed_load(self):
        """The oldest completed load batch's request ids."""

    @abstractmethod
    def offload(self, transfers):
        """Queue every transfer for atomic persistence."""

    @abstractmethod
    def num_completed_offloads(self):
        """Completed offloads waiting to be consumed."""

    @abstractmethod
    def pop_completed_offload(self):
        """The oldest completed offload's result."""

    @abstractmethod
    def reset(self):
        """Quiesce all transfers and reset backend state before returning."""

    @abstractmethod
    def close(self):
        """Quiesce all transfers and release backend resources."""
