"""Stand-in of python/sglang/srt/mem_cache/unified_cache (the external linker)."""
