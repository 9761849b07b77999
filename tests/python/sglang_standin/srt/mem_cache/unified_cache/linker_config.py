"""Stand-in of python/sglang/srt/mem_cache/unified_cache/linker_config.py
at sgl-project/sglang 2c62dc66 (PR #40595, read_file id 69273089643):
--unified-cache-external-linker-config is a JSON object with "linker" (a
class name) and "linker_module_path" (a module), non-empty strings, and an
optional "linker_extra_config" object; any other field is refused."""
from dataclasses import dataclass, field

_FIELDS = {"linker", "linker_module_path", "linker_extra_config"}


@dataclass(frozen=True)
class UnifiedCacheLinkerConfig:
    linker: str
    linker_module_path: str
    linker_extra_config: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw):
        if not isinstance(raw, dict):
            raise ValueError("the external linker config must be a JSON object")
        unknown = set(raw) - _FIELDS
        if unknown:
            raise ValueError(f"unknown external linker config fields: {sorted(unknown)}")
        for name in ("linker", "linker_module_path"):
            if not isinstance(raw.get(name), str) or not raw.get(name):
                raise ValueError(f"external linker config: {name} must be a non-empty string")
        extra = raw.get("linker_extra_config", {})
        if not isinstance(extra, dict):
            raise ValueError("external linker config: linker_extra_config must be an object")
        return cls(raw["linker"], raw["linker_module_path"], dict(extra))
