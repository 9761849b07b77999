"""hostkv.vllm: vLLM's KV offloading (OffloadingConnector) on hostkvd, a
node-wide, restart-proof CPU KV cache shared by every vLLM instance of the
same model and layout.

    vllm serve MODEL --kv-transfer-config '{"kv_connector":"OffloadingConnector",
      "kv_role":"kv_both","kv_connector_extra_config":{
        "spec_name":"HostkvOffloadingSpec","spec_module_path":"hostkv.vllm"}}'

Supported: vLLM v0.11-v0.20 (vllm.v1.kv_offload.{abstract,mediums,spec});
v0.21 and later moved the API into vllm.v1.kv_offload.base and are not
supported yet. See README.md, "Using hostkv with vLLM".
"""
try:
    from .spec import HostkvOffloadingSpec
except ImportError as e:  # pragma: no cover - depends on the vLLM installed
    if "kv_offload" in str(e) or "vllm" in str(e):
        raise ImportError(
            "hostkv.vllm needs vLLM v0.11-v0.20 (vllm.v1.kv_offload.spec, abstract, "
            f"mediums); this environment has none or a newer API: {e}") from e
    raise

__all__ = ["HostkvOffloadingSpec"]
