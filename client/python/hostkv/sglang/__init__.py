"""hostkv for SGLang: HiCache's host KV pool served by hostkvd.

    import hostkv.sglang
    hostkv.sglang.install()   # HiRadixCache now builds the Remote* classes

or, with the package installed, SGLANG_HOSTKV=1 in the engine's environment
(a .pth file calls install() when SGLang's host-pool module is imported).
"""
from .host_pool import (RemoteHostKVCache, RemoteMHATokenToKVPoolHost,
                        RemoteMLATokenToKVPoolHost)
from hostkv_sglang_hook import install, installed

__all__ = ["RemoteHostKVCache", "RemoteMHATokenToKVPoolHost", "RemoteMLATokenToKVPoolHost",
           "install", "installed"]
