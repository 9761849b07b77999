"""hostkv.vllm: vLLM's KV offloading (OffloadingConnector) on hostkvd, a
node-wide, restart-proof CPU KV cache shared by every vLLM instance of the
same model and layout.

    vllm serve MODEL --kv-transfer-config '{"kv_connector":"OffloadingConnector",
      "kv_role":"kv_both","kv_connector_extra_config":{
        "spec_name":"HostkvOffloadingSpec","spec_module_path":"hostkv.vllm"}}'

The vLLM API is chosen by what the installed vLLM has, never by its version
string:
  vllm.v1.kv_offload.config + base   v0.26 and later (spec_v026.py)
  vllm.v1.kv_offload.spec/abstract   v0.11-v0.20 (spec.py)
vLLM v0.21-v0.25 (base.py with the older constructor) are refused with a
message. See README.md beside this file.
"""
import importlib.util
import inspect


def _has_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _era():
    if not _has_module("vllm"):
        return None
    if _has_module("vllm.v1.kv_offload.config") and _has_module("vllm.v1.kv_offload.base"):
        from vllm.v1.kv_offload import base  # pylint: disable=import-outside-toplevel
        params = inspect.signature(base.OffloadingSpec.__init__).parameters
        if "config" in params and "get_worker" in getattr(base.OffloadingSpec,
                                                          "__abstractmethods__", ()):
            return "v0.26+"
        return "v0.21-v0.25"
    if _has_module("vllm.v1.kv_offload.base"):
        return "v0.21-v0.25"
    if _has_module("vllm.v1.kv_offload.spec") and _has_module("vllm.v1.kv_offload.mediums"):
        return "v0.11-v0.20"
    return "unknown"


ERA = _era()

if ERA == "v0.26+":
    from .spec_v026 import HostkvOffloadingSpec
elif ERA == "v0.11-v0.20":
    from .spec import HostkvOffloadingSpec
else:
    raise ImportError(
        "hostkv.vllm serves vLLM v0.26 and later (vllm.v1.kv_offload.config and base, "
        "OffloadingSpec(config), get_worker) and v0.11-v0.20 (vllm.v1.kv_offload.spec, "
        f"abstract, mediums); this environment has {ERA or 'no vllm'}: "
        + ("vLLM v0.21-v0.25 are not served, upgrade vLLM" if ERA == "v0.21-v0.25"
           else "install vLLM"))

__all__ = ["HostkvOffloadingSpec", "ERA"]
