"""Stand-in of python/sglang/srt/distributed/parallel_state.py's
create_custom_parallel_group, as managers/cache_controller.py @001067ff
(_create_sync_groups) calls it: a new torch.distributed group over
group_ranks with the given backend (gloo). The controller calls it only
for groups of more than one rank; the tests here run one rank."""
import torch


def create_custom_parallel_group(group_ranks, backend):
    return torch.distributed.new_group(ranks=list(group_ranks), backend=backend)
