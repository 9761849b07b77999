"""SGLang's token-index tensors <-> hostkv's (first, count) runs.

SGLang moves KV by token indices (int64 tensors); hostkv by runs of pages
(host) and of token slots (device). Everything here checks its input and
raises ValueError (hostkv.errors.InvalidArgument) before anything moves.
"""
from .. import errors


def _torch():
    import torch  # pylint: disable=import-outside-toplevel
    return torch


def as_index_tensor(indices, what):
    """`indices` (a tensor or a sequence) as a 1-D int64 CPU tensor."""
    torch = _torch()
    if not isinstance(indices, torch.Tensor):
        indices = torch.as_tensor(indices, dtype=torch.int64)
    if indices.dim() != 1:
        raise errors.InvalidArgument(f"{what}: a 1-D index tensor, not {indices.dim()}-D")
    if indices.dtype not in (torch.int64, torch.int32):
        raise errors.InvalidArgument(f"{what}: integer indices, not {indices.dtype}")
    return indices.to(device="cpu", dtype=torch.int64)


def _check_within(indices, limit, what, whose):
    """InvalidArgument unless every index (a non-empty tensor) is in [0, limit)."""
    low, high = int(indices.min()), int(indices.max())
    if low < 0 or high >= limit:
        raise errors.InvalidArgument(
            f"{what} {low if low < 0 else high} is outside {whose} {limit} slots")


def runs_of(values):
    """Run-length encodes consecutive ascending values: [(first, count), ...]."""
    torch = _torch()
    n = values.numel()
    if n == 0:
        return []
    starts = torch.ones(n, dtype=torch.bool)
    starts[1:] = values[1:] != values[:-1] + 1
    first_at = torch.nonzero(starts).flatten()
    ends = torch.cat([first_at[1:], torch.tensor([n])])
    return list(zip(values[first_at].tolist(), (ends - first_at).tolist()))


def pages_of(indices, page_size, size, what="host_indices"):
    """The page numbers of `indices`, token slots that cover whole pages in
    order (SGLang's page-aligned runs), each in [0, size)."""
    torch = _torch()
    indices = as_index_tensor(indices, what)
    n = indices.numel()
    if n % page_size != 0:
        raise errors.InvalidArgument(
            f"{what}: {n} indices are not whole pages of {page_size} tokens")
    if n == 0:
        return indices
    _check_within(indices, size, f"{what}: index", "the pool's")
    rows = indices.view(-1, page_size)
    pages = torch.div(rows[:, 0], page_size, rounding_mode="floor")
    expected = pages.unsqueeze(1) * page_size + torch.arange(page_size)
    if not torch.equal(rows, expected):
        raise errors.InvalidArgument(
            f"{what}: indices must cover whole pages in order (page-aligned runs "
            f"of {page_size})")
    return pages


def page_runs(indices, page_size, size, what="host_indices"):
    """[(first_page, num_pages), ...] of page-aligned token `indices`."""
    return runs_of(pages_of(indices, page_size, size, what))


def slot_runs(indices, slots, what="device_indices"):
    """[(first_slot, count), ...] of device token `indices`, each in [0, slots)."""
    indices = as_index_tensor(indices, what)
    if indices.numel() > 0:
        _check_within(indices, slots, f"{what}: slot", "the device pool's")
    return runs_of(indices)


def token_indices(runs, page_size):
    """The token indices (int64) of page runs [(first_page, num_pages), ...]."""
    torch = _torch()
    if not runs:
        return torch.empty(0, dtype=torch.int64)
    return torch.cat([torch.arange(first * page_size, (first + count) * page_size,
                                   dtype=torch.int64) for first, count in runs])
