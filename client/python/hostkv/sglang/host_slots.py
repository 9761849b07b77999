"""Which host slots a remote host pool has handed out, token by token.

hostkvd allocates whole pages; SGLang's host pool (pool_host/base.py) hands
out token slots and takes them back token by token: `free` of any slots
currently allocated, an AssertionError ("Double-free detected") for a slot
that is not, nothing changed then. HostSlots keeps both views: a page goes
back to hostkvd once every one of its tokens is free again.

Every alloc and free of the engine comes through here, so each call is a
few numpy operations on views of the two bitmaps (a free of whole pages in
one ascending run, what alloc handed out, a few slices), never one small
torch operation per step.

Not thread-safe: the host pool calls it under its lock.
"""
from . import indices as idx


def _torch():
    import torch  # pylint: disable=import-outside-toplevel
    return torch


def _numpy():
    import numpy  # pylint: disable=import-outside-toplevel
    return numpy


class HostSlots:
    """The used tokens and held pages of a pool of `page_num` pages."""

    def __init__(self, page_num, page_size):
        torch = _torch()
        self.page_num = page_num
        self.page_size = page_size
        self.size = page_num * page_size
        self.used = torch.zeros(self.size, dtype=torch.bool)
        self.held = torch.zeros(page_num, dtype=torch.bool)
        self._used = self.used.numpy()  # the same memory, for numpy's operations
        self._held = self.held.numpy()
        self.held_pages = 0
        self._run = (None, 0, 0)  # pages_freed_by's last indices, if one run: low, high

    def free_pages(self):
        """Pages hostkvd could still give this pool."""
        return self.page_num - self.held_pages

    def held_page_numbers(self):
        return _torch().from_numpy(self._held.nonzero()[0])

    def take(self, runs):
        """Records pages [(first, count), ...] as held, every token used."""
        ps = self.page_size
        if len(runs) <= 4:
            for first, count in runs:
                self._held[first:first + count] = True
                self._used[first * ps:(first + count) * ps] = True
                self.held_pages += count
            return
        pages = idx.page_numbers(runs)
        self._held[pages] = True
        self._used.reshape(-1, ps)[pages] = True
        self.held_pages += pages.shape[0]

    def reset(self):
        self.used.zero_()
        self.held.zero_()
        self.held_pages = 0

    def pages_freed_by(self, indices):
        """The pages that freeing token slots `indices` (a 1-D int64 CPU
        tensor) would give back: those whose every token is then free.
        AssertionError, as SGLang's free, for a slot not allocated (or
        named twice); IndexError for one outside the pool. Changes nothing.
        """
        np = _numpy()
        self._run = (None, 0, 0)
        tokens = indices.numpy()
        n = tokens.shape[0]
        if n == 0:
            return indices
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= self.size:
            raise IndexError(
                f"free: slot {low if low < 0 else high} is outside the host pool's "
                f"{self.size} slots")
        ps, used = self.page_size, self._used
        ascending = n == 1 or not np.count_nonzero(tokens[1:] <= tokens[:-1])
        if ascending and high - low == n - 1:
            # One run low..high (what alloc handed out, or a part of it).
            if np.count_nonzero(used[low:high + 1]) != n:
                self._not_allocated(tokens)
            self._run = (indices, low, high)
            first, end = low // ps, high // ps + 1
            if low % ps and np.count_nonzero(used[first * ps:low]):
                first += 1  # its first page keeps slots before the run
            if end > first and (high + 1) % ps and np.count_nonzero(used[high + 1:end * ps]):
                end -= 1  # its last page keeps slots after the run
            return _torch().arange(first, max(first, end), dtype=_torch().int64)
        if not ascending:
            ordered = np.sort(tokens)
            if np.count_nonzero(ordered[1:] == ordered[:-1]):
                raise AssertionError(
                    "Double-free detected: a slot appears more than once in one free.")
        if np.count_nonzero(used[tokens]) != n:
            self._not_allocated(tokens)
        if not ascending:
            pages = np.unique(tokens // ps)
        else:
            each = tokens // ps
            new_page = np.empty(n, dtype=bool)
            new_page[0] = True
            np.not_equal(each[1:], each[:-1], out=new_page[1:])
            pages = each[new_page]
            if pages.shape[0] * ps == n:  # n distinct slots in these pages: all of them
                return _torch().from_numpy(pages)
        used[tokens] = False  # undone below: a page goes back if no slot stays used
        try:
            left = np.logical_or.reduce(used.reshape(-1, ps)[pages], axis=1)
        finally:
            used[tokens] = True
        return _torch().from_numpy(pages[~left])

    def _not_allocated(self, tokens):
        bad = tokens[~self._used[tokens]][:16].tolist()
        raise AssertionError(f"Double-free detected: slots not currently allocated: {bad}.")

    def release(self, indices, pages):
        """Marks `indices` free and `pages` (from pages_freed_by) not held."""
        run, low, high = self._run
        self._run = (None, 0, 0)
        if run is indices:
            self._used[low:high + 1] = False
        else:
            self._used[indices.numpy()] = False
        if pages.numel():
            self._held[pages.numpy()] = False
            self.held_pages -= pages.numel()
