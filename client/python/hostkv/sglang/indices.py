"""SGLang's token-index tensors <-> hostkv's (first, count) runs.

SGLang moves KV by token indices (int64 tensors); hostkv by runs of pages
(host) and of token slots (device). Everything here checks its input and
raises ValueError (hostkv.errors.InvalidArgument) before anything moves.

This is on the scheduler's path for every alloc, free and transfer, so it
costs a few vectorised numpy operations on the index tensor's memory (one
device-to-host copy at most, none for a CPU tensor), not one small torch
operation per step: a run of consecutive values is found from where
a[i + 1] - a[i] != 1, and host indices are whole pages in order exactly
when every such run starts on a page boundary, both in position and in
value. (numpy: SGLang needs it, and torch's Tensor.numpy is how the index
tensor's memory is read; the code runs on torch 1.13 and 2.x alike.)
"""
import itertools

from .. import errors


def _torch():
    import torch  # pylint: disable=import-outside-toplevel
    return torch


def _numpy():
    import numpy  # pylint: disable=import-outside-toplevel
    return numpy


def _checked(torch, indices, what):
    """`indices` (a tensor or a sequence) as a 1-D int32/int64 tensor."""
    if not isinstance(indices, torch.Tensor):
        indices = torch.as_tensor(indices, dtype=torch.int64)
    if indices.dim() != 1:
        raise errors.InvalidArgument(f"{what}: a 1-D index tensor, not {indices.dim()}-D")
    if indices.dtype is not torch.int64 and indices.dtype is not torch.int32:
        raise errors.InvalidArgument(f"{what}: integer indices, not {indices.dtype}")
    return indices


def as_index_tensor(indices, what):
    """`indices` (a tensor or a sequence) as a 1-D int64 CPU tensor."""
    torch = _torch()
    return _checked(torch, indices, what).to(device="cpu", dtype=torch.int64)


def index_array(indices, what):
    """`indices` (a tensor or a sequence) as a 1-D int64 numpy array on the
    host: the tensor's own memory for an int64 CPU tensor, else one copy
    (the only device-to-host copy of the call, for a device tensor)."""
    torch = _torch()
    indices = _checked(torch, indices, what)
    if indices.device.type != "cpu":
        indices = indices.cpu()
    if indices.dtype is torch.int32:
        return indices.numpy().astype(_numpy().int64)
    return indices.numpy()


def _check_within(array, limit, what, whose):
    """InvalidArgument unless every index (a non-empty array) is in [0, limit)."""
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= limit:
        raise errors.InvalidArgument(
            f"{what} {low if low < 0 else high} is outside {whose} {limit} slots")


def _run_bounds(array):
    """Where the runs of consecutive ascending values of `array` (n >= 1
    values) start, then n: [0, ..., n]; None if it is one run."""
    np = _numpy()
    if array.shape[0] < 2:
        return None
    breaks = (array[1:] - array[:-1] != 1).nonzero()[0]
    if breaks.shape[0] == 0:
        return None
    bounds = np.empty(breaks.shape[0] + 2, dtype=np.int64)
    bounds[0] = 0
    np.add(breaks, 1, out=bounds[1:-1])
    bounds[-1] = array.shape[0]
    return bounds


def _bounds_within(array, limit, what, whose):
    """_run_bounds(array) of a non-empty array whose every value is checked
    to be in [0, limit)."""
    bounds = _run_bounds(array)
    # One run a[0], a[0] + 1, ..., a[-1] lies between its ends when both
    # are in [0, limit) (its fewer than 2**63 steps cannot wrap around).
    if bounds is not None or not 0 <= int(array[0]) <= int(array[-1]) < limit:
        _check_within(array, limit, what, whose)
    return bounds


def _runs(array, bounds):
    """[(first, count), ...] of a non-empty array with run bounds `bounds`."""
    if bounds is None:
        return [(int(array[0]), array.shape[0])]
    starts = bounds[:-1]
    return list(zip(array[starts].tolist(), (bounds[1:] - starts).tolist()))


def runs_of(values):
    """Run-length encodes consecutive ascending values (a tensor, a numpy
    array or a sequence of ints): [(first, count), ...]."""
    np = _numpy()
    if isinstance(values, _torch().Tensor):
        values = (values if values.device.type == "cpu" else values.cpu()).numpy()
    values = np.asarray(values, dtype=np.int64)
    return _runs(values, _run_bounds(values)) if values.shape[0] else []


def _page_runs(array, page_size, size, what):
    """[(first_page, num_pages), ...] of the token slots `array`, checked:
    whole pages in order (SGLang's page-aligned runs), each in [0, size)."""
    np = _numpy()
    n = array.shape[0]
    if n % page_size != 0:
        raise errors.InvalidArgument(
            f"{what}: {n} indices are not whole pages of {page_size} tokens")
    if n == 0:
        return []
    bounds = _bounds_within(array, size, f"{what}: index", "the pool's")
    if page_size == 1:
        return _runs(array, bounds)
    if bounds is None:
        first = int(array[0])
        if first % page_size == 0:
            return [(first // page_size, n // page_size)]
    else:
        # Whole pages in order: every run starts on a page, in value and in
        # position (that is, every run is whole pages long).
        starts = bounds[:-1]
        pages, offsets = np.divmod(array[starts], page_size)
        lengths, rests = np.divmod(bounds[1:] - starts, page_size)
        if not (np.count_nonzero(offsets) or np.count_nonzero(rests)):
            return list(zip(pages.tolist(), lengths.tolist()))
    raise errors.InvalidArgument(
        f"{what}: indices must cover whole pages in order (page-aligned runs "
        f"of {page_size})")


def pages_of(indices, page_size, size, what="host_indices"):
    """The page numbers of `indices`, token slots that cover whole pages in
    order (SGLang's page-aligned runs), each in [0, size): an int64 tensor."""
    torch = _torch()
    array = index_array(indices, what)
    _page_runs(array, page_size, size, what)
    return torch.from_numpy(array[::page_size] // page_size)


def page_runs(indices, page_size, size, what="host_indices"):
    """[(first_page, num_pages), ...] of page-aligned token `indices`."""
    return _page_runs(index_array(indices, what), page_size, size, what)


def slot_runs(indices, slots, what="device_indices"):
    """[(first_slot, count), ...] of device token `indices`, each in [0, slots)."""
    array = index_array(indices, what)
    if array.shape[0] == 0:
        return []
    return _runs(array, _bounds_within(array, slots, f"{what}: slot", "the device pool's"))


def transfer_runs(host_indices, device_indices, page_size, size, slots):
    """(host page runs, device slot runs) of one transfer, checked: whole
    host pages in [0, size), device slots in [0, slots), as many of each."""
    host = index_array(host_indices, "host_indices")
    host_runs = _page_runs(host, page_size, size, "host_indices")
    device = index_array(device_indices, "device_indices")
    bounds = None
    if device.shape[0] > 0:
        bounds = _bounds_within(device, slots, "device_indices: slot", "the device pool's")
    if host.shape[0] != device.shape[0]:
        raise errors.InvalidArgument(
            f"{host.shape[0]} host indices but {device.shape[0]} device indices")
    return host_runs, _runs(device, bounds) if device.shape[0] else []


def page_numbers(runs):
    """The page numbers (an int64 numpy array) of page runs [(first_page, num_pages), ...]."""
    np = _numpy()
    if len(runs) == 1:
        first, count = runs[0]
        return np.arange(first, first + count, dtype=np.int64)
    pairs = np.fromiter(itertools.chain.from_iterable(runs), dtype=np.int64,
                        count=2 * len(runs)).reshape(-1, 2)
    firsts, counts = pairs[:, 0], pairs[:, 1]
    if not np.count_nonzero(counts != 1):
        return firsts
    # Run j's pages are firsts[j] + 0..counts[j]-1: a count up, less where each run starts.
    ends = np.cumsum(counts)
    return np.arange(ends[-1], dtype=np.int64) + np.repeat(firsts - ends + counts, counts)


def token_indices(runs, page_size):
    """The token indices (an int64 tensor) of page runs [(first_page, num_pages), ...]."""
    torch = _torch()
    if not runs:
        return torch.empty(0, dtype=torch.int64)
    if len(runs) == 1:
        first, count = runs[0]
        return torch.arange(first * page_size, (first + count) * page_size,
                            dtype=torch.int64)
    np = _numpy()
    tokens = page_numbers(runs)[:, None] * page_size + np.arange(page_size, dtype=np.int64)
    return torch.from_numpy(tokens.reshape(-1))
