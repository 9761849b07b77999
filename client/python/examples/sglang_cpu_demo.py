"""SGLang's host pool on hostkvd, on the CPU backend, bytes verified.

    build/venv/bin/python client/python/examples/sglang_cpu_demo.py [TARGET]

Does what HiCache's controller does with its host pool: alloc host slots,
back a request's KV up from the device pool (all layers, one call), then
load it back into other device slots layer by layer, and checks every byte
and a storage backend's zero-copy view of the pages.
"""
import ctypes
import os
import sys

import torch

from hostkv.sglang import RemoteMHATokenToKVPoolHost
from hostkv.sglang.cpu_device_pool import CpuMHATokenToKVPool

target = sys.argv[1] if len(sys.argv) > 1 else None  # None: $HOSTKV_TARGET
layers, page = 4, 16
device = CpuMHATokenToKVPool(size=1024, page_size=page, head_num=8, head_dim=128,
                             layer_num=layers, dtype=torch.bfloat16)
host = RemoteMHATokenToKVPoolHost(device, 2.0, 0, page, "layer_first", target=target)
print(f"host pool {host.pool_name}: {host.size} token slots, "
      f"{host.size * host.size_per_token / 2**20:.0f} MiB in hostkvd, layout {host.layout}")

for t in device.k_buffer + device.v_buffer:
    t.normal_()
request = torch.arange(256)                       # device slots of a 256-token prefix
host_idx = host.alloc(256)
host.backup_from_device_all_layer(device, host_idx, request, "kernel")
print(f"backed up 256 tokens x {layers} layers into host slots "
      f"{int(host_idx[0])}..{int(host_idx[-1])}")

before = [t[request].clone() for t in device.k_buffer + device.v_buffer]
elsewhere = torch.arange(512, 768)                # the prefix comes back in other slots
for layer in range(layers):
    host.load_to_device_per_layer(device, host_idx, elsewhere, layer, "kernel")
    ok = (torch.equal(device.k_buffer[layer][elsewhere], before[layer]) and
          torch.equal(device.v_buffer[layer][elsewhere], before[layers + layer]))
    print(f"layer {layer} loaded: {'bytes match' if ok else 'MISMATCH'}")
    assert ok

pointers, sizes = host.get_page_buffer_meta(host_idx[:page])
k0 = ctypes.string_at(pointers[0], sizes[0])
assert k0 == before[0][:page].contiguous().view(torch.uint8).numpy().tobytes()
print(f"zero-copy page view: {len(pointers)} pieces of {sizes[0]} bytes, bytes match")
host.free(host_idx)
print(f"freed; {host.available_size()} of {host.size} slots available")
host.close()
print("OK")
