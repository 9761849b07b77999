"""hostkv's SGLang plugin (entry point "hostkv" of the group
"sglang.srt.plugins", installed by `pip install ./client/python`): the way
HostkvLinker enters SGLang trees that have the unified cache's external
linker but not the linker config flag (PR #40595). SGLang's scheduler
process calls register() before it builds its tree cache; it registers the
radix cache backend "hostkv", whose factory builds SGLang's
UnifiedRadixCache with HostkvLinker attached, as SGLang's own linker setup
does:

    pip install ./client/python          # in the engine's image
    HOSTKV_LINKER_CONFIG='{"hostkv_capacity_bytes": 17179869184}' \\
    python -m sglang.launch_server --model-path MODEL \\
      --radix-cache-backend hostkv --enable-unified-cache-external-linker

HOSTKV_LINKER_CONFIG (optional, JSON): HostkvLinker's options
(linker_extra_config of the config flag's form). The TP rank and size come
from SGLang's build context. Refused with a message (the engine does not
start): no --enable-unified-cache-external-linker (SGLang would never start
the layer-wise loads), hierarchical cache, a disabled radix cache, Mamba
models, DSA. A hybrid sliding-window model gets SGLang's FULL and SWA tree
components (HostkvLinker restores both).
"""
import json
import logging
import os

logger = logging.getLogger("hostkv.sglang")

BACKEND = "hostkv"


def register():
    """The entry point: registers the "hostkv" radix cache backend."""
    from sglang.srt.mem_cache.registry import \
        register_radix_cache_backend  # pylint: disable=import-outside-toplevel
    register_radix_cache_backend(BACKEND, create_cache)


def _check(ctx):
    from sglang.srt.runtime_context import get_memory  # pylint: disable=import-outside-toplevel
    problems = []
    if not getattr(get_memory(), "enable_unified_cache_external_linker", False):
        problems.append("--enable-unified-cache-external-linker is not set (SGLang would "
                        "never start the layer-wise loads)")
    if ctx.enable_hierarchical_cache:
        problems.append("--enable-hierarchical-cache is set (the linker replaces HiCache)")
    if ctx.disable_radix_cache:
        problems.append("the radix cache is disabled")
    if ctx.is_hybrid_ssm or getattr(ctx, "is_dsa", False):
        problems.append("the model is hybrid with Mamba state, or DSA: HostkvLinker restores "
                        "full-attention and sliding-window KV only")
    if problems:
        raise ValueError("--radix-cache-backend hostkv: " + "; ".join(problems))


def create_cache(ctx):
    """SGLang's radix cache factory (registry.TreeCacheBuildContext -> cache)."""
    # pylint: disable=import-outside-toplevel
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from .linker import HostkvLinker
    _check(ctx)
    extra = json.loads(os.environ.get("HOSTKV_LINKER_CONFIG") or "{}")
    if not isinstance(extra, dict):
        raise ValueError("HOSTKV_LINKER_CONFIG must be a JSON object")
    extra.setdefault("tp_rank", ctx.tp_rank)
    extra.setdefault("tp_size", ctx.tp_size)
    ctx.params.tree_components = ((ComponentType.FULL, ComponentType.SWA) if ctx.is_hybrid_swa
                                  else (ComponentType.FULL,))
    cache = UnifiedRadixCache(ctx.params)
    linker = HostkvLinker(ctx.server_args, ctx.params, components=set(cache.components),
                          extra_config=extra)
    try:
        cache.init_cache_linker(linker)
    except BaseException:
        linker.close()
        raise
    counter = linker.layer_done_counter
    ctx.params.token_to_kv_pool_allocator.get_kvcache().register_layer_transfer_counter(
        counter)
    ctx.tp_worker.register_hicache_layer_transfer_counter(counter)
    return cache
