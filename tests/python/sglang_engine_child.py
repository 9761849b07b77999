"""An SGLang-like engine process for test_sglang_engine.py: a remote host
pool, then backups in a loop until it is killed. Prints "ready POOL" once
the first backup is done."""
import sys

import torch

from hostkv.sglang import RemoteMHATokenToKVPoolHost
from sglang_model import DevicePool


def main(target):
    device = DevicePool("mha", 4, size=2048, page_size=16, head_num=8, head_dim=128)
    host = RemoteMHATokenToKVPoolHost(device, 2.0, 0, 16, "layer_first", target=target)
    device.fill_random(torch.Generator().manual_seed(3))
    idx = host.alloc(2048)
    dev = torch.arange(2048)
    host.backup_from_device_all_layer(device, idx, dev, "kernel")
    print("ready", host.pool_name, flush=True)
    while True:
        host.backup_from_device_all_layer(device, idx, dev, "kernel")


if __name__ == "__main__":
    main(sys.argv[1])
