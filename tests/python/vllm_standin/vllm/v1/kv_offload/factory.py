"""Stand-in of vllm/v1/kv_offload/factory.py as of vLLM v0.14+
(create_spec(config, kv_cache_config); docs.vllm.ai v0.14.0
api/vllm/v1/kv_offload/factory). The v0.11 form, at vllm-project/vllm
07b13497a9b52274d334090a9a8e04d5ec9ca7e9, is create_spec(config) and
constructs spec_cls(config); drive.create_spec offers both.

create_spec reads kv_transfer_config.kv_connector_extra_config:
spec_name (default "CPUOffloadingSpec"); a registered name is loaded
lazily from its registered module; any other name needs spec_module_path
(ValueError "Unsupported spec type" otherwise), which is imported with
importlib and the class taken by getattr(module, spec_name)
(AttributeError if missing). Then `assert issubclass(spec_cls,
OffloadingSpec)` (AssertionError for another class, TypeError for a
non-class) and the spec is constructed.
The built-in CPUOffloadingSpec is registered as upstream does, but its
module is not part of the stand-in (loading it fails on import).
"""
import importlib
from typing import Callable

from vllm.logger import init_logger
from vllm.v1.kv_offload.spec import OffloadingSpec

logger = init_logger(__name__)


class OffloadingSpecFactory:
    _registry: dict[str, Callable[[], type[OffloadingSpec]]] = {}

    @classmethod
    def register_spec(cls, name: str, module_path: str, class_name: str) -> None:
        if name in cls._registry:
            raise ValueError(f"Connector '{name}' is already registered.")

        def loader() -> type[OffloadingSpec]:
            return getattr(importlib.import_module(module_path), class_name)

        cls._registry[name] = loader

    @classmethod
    def get_spec_class(cls, config) -> type[OffloadingSpec]:
        kv_transfer_config = config.kv_transfer_config
        assert kv_transfer_config is not None
        extra_config = kv_transfer_config.kv_connector_extra_config
        spec_name = extra_config.get("spec_name", "CPUOffloadingSpec")
        if spec_name in cls._registry:
            spec_cls = cls._registry[spec_name]()
        else:
            spec_module_path = extra_config.get("spec_module_path")
            if spec_module_path is None:
                raise ValueError(f"Unsupported spec type: {spec_name}")
            spec_cls = getattr(importlib.import_module(spec_module_path), spec_name)
        assert issubclass(spec_cls, OffloadingSpec)
        logger.info("Creating offloading spec with name: %s", spec_name)
        return spec_cls

    @classmethod
    def create_spec(cls, config, kv_cache_config) -> OffloadingSpec:
        return cls.get_spec_class(config)(config, kv_cache_config)


OffloadingSpecFactory.register_spec(
    "CPUOffloadingSpec", "vllm.v1.kv_offload.cpu.spec", "CPUOffloadingSpec")
