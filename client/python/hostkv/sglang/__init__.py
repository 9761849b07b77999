"""hostkv for SGLang: HiCache's host KV pool served by hostkvd, and its
storage tier on hostkvd's page cache.

    import hostkv.sglang
    hostkv.sglang.install()   # HiRadixCache now builds the Remote* classes

or, with the package installed, SGLANG_HOSTKV=1 in the engine's environment
(a .pth file calls install() when SGLang's host-pool module is imported).

hostkv.sglang.HostkvStorage (module hostkv.sglang.storage) is an SGLang
HiCacheStorage: --hicache-storage-backend dynamic loads it. It is imported
on first use, so that importing this package (which install() does while
SGLang's modules load) never imports SGLang's storage modules.
"""
from .host_pool import (RemoteHostKVCache, RemoteMHATokenToKVPoolHost,
                        RemoteMLATokenToKVPoolHost)
from hostkv_sglang_hook import install, installed

__all__ = ["RemoteHostKVCache", "RemoteMHATokenToKVPoolHost", "RemoteMLATokenToKVPoolHost",
           "HostkvStorage", "install", "installed"]


def __getattr__(name):
    if name == "HostkvStorage":
        from .storage import HostkvStorage  # pylint: disable=import-outside-toplevel
        return HostkvStorage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
