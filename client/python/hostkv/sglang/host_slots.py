"""Which host slots a remote host pool has handed out, token by token.

hostkvd allocates whole pages; SGLang's host pool (pool_host/base.py) hands
out token slots and takes them back token by token: `free` of any slots
currently allocated, an AssertionError ("Double-free detected") for a slot
that is not, nothing changed then. HostSlots keeps both views: a page goes
back to hostkvd once every one of its tokens is free again.

Not thread-safe: the host pool calls it under its lock.
"""


def _torch():
    import torch  # pylint: disable=import-outside-toplevel
    return torch


class HostSlots:
    """The used tokens and held pages of a pool of `page_num` pages."""

    def __init__(self, page_num, page_size):
        torch = _torch()
        self.page_num = page_num
        self.page_size = page_size
        self.size = page_num * page_size
        self.used = torch.zeros(self.size, dtype=torch.bool)
        self.held = torch.zeros(page_num, dtype=torch.bool)
        self.held_pages = 0

    def free_pages(self):
        """Pages hostkvd could still give this pool."""
        return self.page_num - self.held_pages

    def held_page_numbers(self):
        return _torch().nonzero(self.held).flatten()

    def take(self, runs):
        """Records pages [(first, count), ...] as held, every token used."""
        for first, count in runs:
            self.held[first:first + count] = True
            self.used[first * self.page_size:(first + count) * self.page_size] = True
            self.held_pages += count

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
        torch = _torch()
        if indices.numel() == 0:
            return indices
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= self.size:
            raise IndexError(
                f"free: slot {low if low < 0 else high} is outside the host pool's "
                f"{self.size} slots")
        unique = torch.unique(indices)
        if unique.numel() != indices.numel():
            raise AssertionError(
                "Double-free detected: a slot appears more than once in one free.")
        if not bool(self.used[indices].all()):
            bad = indices[~self.used[indices]][:16].tolist()
            raise AssertionError(
                f"Double-free detected: slots not currently allocated: {bad}.")
        pages = torch.unique(torch.div(unique, self.page_size, rounding_mode="floor"))
        rows = pages.unsqueeze(1) * self.page_size + torch.arange(self.page_size)
        still_used = self.used[rows].clone()
        still_used[torch.isin(rows, unique)] = False
        return pages[~still_used.any(dim=1)]

    def release(self, indices, pages):
        """Marks `indices` free and `pages` (from pages_freed_by) not held."""
        self.used[indices] = False
        if pages.numel():
            self.held[pages] = False
            self.held_pages -= pages.numel()
