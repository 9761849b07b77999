"""vllm_standin: a stand-in of the parts of vLLM's KV offloading API that a
third-party OffloadingSpec meets, rebuilt from facts read in vLLM's public
source (vllm-project/vllm; notes in client/python/hostkv/vllm/NOTES.md) and
written here in our own code.

The package tree under vllm_standin/vllm/ mirrors vLLM's module paths
(vllm.v1.kv_offload.spec is vllm/v1/kv_offload/spec.py): put this folder
on sys.path (install()) and `import vllm.v1.kv_offload.spec` gives the
stand-in, which is what a spec written for stock vLLM imports. Each module's
docstring names the upstream file and commit it models.

Modelled era: the API of vLLM v0.19-v0.20 (abstract.py / spec.py /
mediums.py / worker/worker.py; spec constructed as
spec_cls(vllm_config, kv_cache_config); get_handlers(CanonicalKVCaches)),
with the older spec_cls(vllm_config) construction of v0.11-v0.13 available
through drive.create_spec(era="v0.11"). vLLM v0.21+ replaced these modules
by vllm/v1/kv_offload/base.py (see NOTES.md); that API is NOT modelled.

drive.py runs the OffloadingConnector's call order against any spec;
selfcheck.py (plain python3) drives an in-memory spec through it.
"""
import os
import sys

STANDIN_ROOT = os.path.dirname(os.path.abspath(__file__))


def install():
    """Puts the stand-in's `vllm` first on sys.path. Raises RuntimeError if
    a different module named vllm is imported already."""
    loaded = sys.modules.get("vllm")
    if loaded is not None and not getattr(loaded, "__file__", "").startswith(STANDIN_ROOT):
        raise RuntimeError("a module named vllm (not the stand-in) is imported already")
    if STANDIN_ROOT not in sys.path:
        sys.path.insert(0, STANDIN_ROOT)
