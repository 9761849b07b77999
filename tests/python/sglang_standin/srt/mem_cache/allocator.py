"""Stand-in of python/sglang/srt/mem_cache/allocator.py's token-to-KV
allocators as managers/cache_controller.py @001067ff uses one:
get_kvcache() (the device pool), alloc(need_size) -> int64 token indices
or None when too few are free (load() passes len(host_indices)), and
free(indices) (evict_device). allocator.py itself was not read; the shape
follows SGLang's allocators as the device pools reflect it (size +
page_size rows: slot 0 / page 0 is never handed out):

- page_size 1 (TokenToKVPoolAllocator): token-granular, free slots
  1..size, first free first out, freed slots go to the back;
- page_size > 1 (PagedTokenToKVPoolAllocator): the same over pages
  1..size // page_size; alloc asserts a page multiple and returns the
  pages' token indices; free takes token indices and frees their pages.
"""
import torch


class TokenToKVPoolAllocator:
    def __init__(self, size, page_size, kvcache, device="cpu"):
        self.size = size
        self.page_size = page_size
        self.device = device
        self._kvcache = kvcache
        self.clear()

    def get_kvcache(self):
        return self._kvcache

    def clear(self):
        self.free_pages = torch.arange(1, self.size // self.page_size + 1, dtype=torch.int64)

    def available_size(self):
        return len(self.free_pages) * self.page_size

    def alloc(self, need_size):
        if self.page_size > 1:
            assert need_size % self.page_size == 0, "The allocation size should be page-aligned"
        num_pages = need_size // self.page_size
        if num_pages > len(self.free_pages):
            return None
        pages, self.free_pages = self.free_pages[:num_pages], self.free_pages[num_pages:]
        return (pages.unsqueeze(1) * self.page_size
                + torch.arange(self.page_size, dtype=torch.int64)).reshape(-1)

    def free(self, free_index):
        if free_index.numel() == 0:
            return
        pages = torch.unique(torch.div(free_index.cpu(), self.page_size,
                                       rounding_mode="floor"))
        self.free_pages = torch.cat([self.free_pages, pages])


PagedTokenToKVPoolAllocator = TokenToKVPoolAllocator
