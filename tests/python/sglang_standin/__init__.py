"""sglang_standin: a stand-in of the parts of SGLang's HiCache that drive a
host KV pool and a storage backend, rebuilt from facts read in SGLang's
public source (sgl-project/sglang; notes in /work/notes) and written here
in our own code. Module paths mirror SGLang's (sglang_standin.srt.X is
python/sglang/srt/X); each module's docstring names the SGLang file and
commit it models:

- srt/managers/cache_controller.py   managers/cache_controller.py @001067ff
- srt/mem_cache/l2_transfer.py        mem_cache/l2_transfer.py @67e863cd, @086fe1aa
- srt/mem_cache/hicache_storage.py    mem_cache/hicache_storage.py @001067ff
- srt/mem_cache/storage/              mem_cache/storage/backend_factory.py @001067ff
- srt/mem_cache/hiradix_cache.py      mem_cache/hiradix_cache.py @39baee9e (a driver)
- srt/mem_cache/pool_host/            pool_host/base.py @39baee9e/@086fe1aa, mha.py
                                      @39baee9e, mla.py @c7631876 (the contract)
- srt/mem_cache/memory_pool.py, allocator.py, utils.py, srt/utils.py,
  srt/cpu_device.py, ...              what those call, on the CPU

It is named sglang_standin, not sglang, so that it never meets the module
trees other tests write for `sglang`. as_sglang() aliases it as `sglang`
for the length of a with block (what stock SGLang's dynamic storage
backend loading needs: hostkv.sglang.storage subclasses
sglang.srt.mem_cache.hicache_storage.HiCacheStorage when that imports).
"""
import contextlib
import importlib
import pkgutil
import sys

_MISSING = object()


def import_all():
    """Imports every module of the stand-in (so as_sglang can alias them)."""
    for info in pkgutil.walk_packages(__path__, prefix=__name__ + "."):
        importlib.import_module(info.name)


@contextlib.contextmanager
def as_sglang(reimport=("hostkv.sglang.storage",)):
    """Within the block, `import sglang.srt...` gives this stand-in's
    modules, and the modules named in `reimport` are imported afresh (so
    that what they import from sglang is the stand-in). Afterwards
    sys.modules (and the parent packages' attributes) are as before."""
    if "sglang" in sys.modules and sys.modules["sglang"] is not sys.modules[__name__]:
        raise RuntimeError("a module named sglang is imported already")
    import_all()
    saved = {}
    for name in [n for n in list(sys.modules) if n == __name__ or n.startswith(__name__ + ".")]:
        alias = "sglang" + name[len(__name__):]
        saved[alias] = sys.modules.get(alias, _MISSING)
        sys.modules[alias] = sys.modules[name]
    parents = {}
    for name in reimport:
        saved[name] = sys.modules.pop(name, _MISSING)
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            parents[name] = (sys.modules[parent], child,
                             getattr(sys.modules[parent], child, _MISSING))
    try:
        for name in reimport:
            importlib.import_module(name)
        yield
    finally:
        for name, module in saved.items():
            if module is _MISSING:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        for parent, child, value in parents.values():
            if value is _MISSING:
                if hasattr(parent, child):
                    delattr(parent, child)
            else:
                setattr(parent, child, value)
