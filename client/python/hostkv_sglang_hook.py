"""The patch point: SGLang builds hostkv's host pools instead of its own.

A top-level module of the stdlib only, so that hostkv-sglang.pth can load
it at interpreter start (before site-packages are all on sys.path) at no
cost: hostkv itself is imported when SGLang's first module is.

SGLang has no hook for its host pool (HiRadixCache picks the class with
isinstance on the device pool), so install() rebinds two names, and only
those: MHATokenToKVPoolHost and MLATokenToKVPoolHost, wherever a module of
SGLang holds SGLang's own class under that name, now and in modules
imported later. Everything else of SGLang is untouched; subclasses SGLang
defines (e.g. NSA's host pool) keep their in-process base.

Opt-in: nothing happens unless the engine calls install(), or runs with
SGLANG_HOSTKV=1 and the package installed (its hostkv-sglang.pth then
calls install() at interpreter start, before SGLang is imported).
hostkv.sglang.install is this install.
"""
import importlib.abc
import importlib.machinery
import logging
import sys
import threading

_log = logging.getLogger("hostkv.sglang")
_REMOTE = {"MHATokenToKVPoolHost": "RemoteMHATokenToKVPoolHost",
           "MLATokenToKVPoolHost": "RemoteMLATokenToKVPoolHost"}
# Where SGLang defines its host pools (older and newer trees).
_DEFINED_IN = ("sglang.srt.mem_cache.memory_pool_host", "sglang.srt.mem_cache.pool_host")
# SGLang's choice of MHA host pool class (pool_host/mha.py).
_CHOOSER = "get_mha_host_pool_cls"
_lock = threading.Lock()
_finder = None


def _is_sglangs(name, value):
    return (isinstance(value, type) and value.__name__ == name
            and value.__module__.startswith(_DEFINED_IN))


def _watch_class_choice(module):
    """Wraps SGLang's get_mha_host_pool_cls (where `module` defines it) so
    that a model it gives SGLang's own host pool class (head_dim !=
    v_head_dim: AsymmetricMHATokenToKVPoolHost) says so in the log: that
    pool stays in the engine process."""
    chooser = module.__dict__.get(_CHOOSER)
    if (not callable(chooser) or getattr(chooser, "_hostkv_watched", False)
            or not getattr(chooser, "__module__", "").startswith(_DEFINED_IN)):
        return 0

    def choose(device_pool, *args, **kwargs):
        cls = chooser(device_pool, *args, **kwargs)
        if not cls.__module__.startswith("hostkv."):
            _log.warning(
                "hostkv: %s (head_dim %s, v_head_dim %s) is served by SGLang's own "
                "in-process host pool, not hostkvd: hostkvd pools have one head width "
                "for K and V", cls.__name__, getattr(device_pool, "head_dim", "?"),
                getattr(device_pool, "v_head_dim", "?"))
        return cls

    choose._hostkv_watched = True  # pylint: disable=protected-access
    choose.__wrapped__ = chooser
    setattr(module, _CHOOSER, choose)
    return 1


def _patch(module):
    """Rebinds the two names in `module` (and watches SGLang's class
    chooser); returns how many names it rebound."""
    names = [name for name in _REMOTE if _is_sglangs(name, module.__dict__.get(name))]
    if names:
        from hostkv.sglang import host_pool  # pylint: disable=import-outside-toplevel
        for name in names:
            setattr(module, name, getattr(host_pool, _REMOTE[name]))
    _watch_class_choice(module)
    return len(names)


class _PatchingLoader(importlib.abc.Loader):
    """Runs an SGLang module as its own loader would, then patches it."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        if _patch(module):
            _log.info("hostkv: %s uses hostkvd's host pools", module.__name__)

    def __getattr__(self, name):  # get_data, get_filename, is_package, ...
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith("sglang."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None and hasattr(spec.loader,
                                                                    "exec_module"):
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def install():
    """Makes SGLang's HiCache use hostkvd (idempotent). Returns the names of
    the already-imported modules it patched."""
    global _finder  # pylint: disable=global-statement
    with _lock:
        patched = [name for name, module in list(sys.modules.items())
                   if name.startswith("sglang.") and module is not None and _patch(module)]
        if _finder is None:
            _finder = _Finder()
            sys.meta_path.insert(0, _finder)
    return patched


def installed():
    return _finder is not None
