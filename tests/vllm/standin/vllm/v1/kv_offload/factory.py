"""Models vllm/v1/kv_offload/factory.py in its v0.26+ form (the stored
version read as id 54659653457): create_spec(config) resolves
extra_config["spec_name"] (default CPUOffloadingSpec) through the registered
names or extra_config["spec_module_path"], checks the class is an
OffloadingSpec and constructs it with the OffloadingConfig alone."""
import importlib

from vllm.v1.kv_offload.base import OffloadingSpec

_REGISTERED = {}  # vLLM's own specs; none in the stand-in


class OffloadingSpecFactory:
    @classmethod
    def get_spec_cls(cls, extra_config):
        name = extra_config.get("spec_name", "CPUOffloadingSpec")
        if name in _REGISTERED:
            module_path = _REGISTERED[name]
        else:
            module_path = extra_config.get("spec_module_path")
            if module_path is None:
                raise ValueError(f"Unsupported spec type: {name}")
        spec_cls = getattr(importlib.import_module(module_path), name)
        assert issubclass(spec_cls, OffloadingSpec)
        return spec_cls

    @classmethod
    def create_spec(cls, config):
        return cls.get_spec_cls(config.extra_config)(config)
