"""Models vllm/v1/metrics/cache_hit_source.py (imported by base.py @0105e232):
where a request's cached tokens came from."""
import enum


class CacheHitSource(str, enum.Enum):
    DEVICE = "device"
    HOST = "host"
    P2P = "p2p"
    DISK = "disk"
    EXTERNAL_UNSPECIFIED = "external_unspecified"
