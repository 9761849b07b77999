"""Stand-in of python/sglang/srt/utils as managers/cache_controller.py
@001067ff and mem_cache/l2_transfer.py @67e863cd / @086fe1aa import it:
get_device_module() (torch.cuda on CUDA) gives the CPU device module of
cpu_device.py here."""
from . import cpu_device


def get_device_module():
    return cpu_device
