"""A warm restart through hostkvd's page cache, on the CPU backend.

    build/venv/bin/python client/python/examples/warm_restart_demo.py [TARGET]

TARGET defaults to $HOSTKV_TARGET, else unix:/run/hostkv/hostkvd.sock.

Engine 1 (a child process) computes a prompt's KV, backs it up to host
pages and publishes them under SGLang's page keys through HostkvStorage
(the storage tier stock SGLang loads with --hicache-storage-backend
dynamic); then it is killed with SIGKILL, as a crashed engine would be.
Engine 2 (this process) computes the same keys from the same tokens, finds
them in hostkvd, loads the pages into its host pool and from there into
its device buffers layer by layer, and checks every byte against what
engine 1 had. The pages never left hostkvd: engine 1's death freed its
own pages, not the cached ones.
"""
import dataclasses
import hashlib
import os
import signal
import subprocess
import sys
from typing import Optional

import torch

import hostkv
from hostkv.sglang import HostkvStorage, RemoteMHATokenToKVPoolHost
from hostkv.sglang.cpu_device_pool import CpuMHATokenToKVPool

LAYERS, PAGE, PROMPT = 4, 16, 8 * 16      # 8 pages of 16 tokens
POOL = "warm-restart-demo"                # a named pool: it outlives its engines


@dataclasses.dataclass
class StorageConfig:                      # SGLang's HiCacheStorageConfig, the fields used
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    is_mla_model: bool = False
    model_name: Optional[str] = "demo-org/demo-model"
    extra_config: Optional[dict] = None


def page_keys(tokens):
    """SGLang's keys: per page, SHA-256 of the previous key's bytes and the
    page's token ids (4 bytes little-endian each), as hex."""
    keys, prior = [], None
    for start in range(0, len(tokens), PAGE):
        h = hashlib.sha256(bytes.fromhex(prior) if prior else b"")
        for t in tokens[start:start + PAGE]:
            h.update(t.to_bytes(4, "little"))
        prior = h.hexdigest()
        keys.append(prior)
    return keys


def engine(target):
    """An engine's device pool (shm tensors), host pool and storage tier."""
    device = CpuMHATokenToKVPool(size=1024, page_size=PAGE, head_num=8, head_dim=128,
                                 layer_num=LAYERS, dtype=torch.bfloat16)
    host = RemoteMHATokenToKVPoolHost(device, 2.0, 0, PAGE, "page_first", target=target,
                                      pool_name=POOL)
    storage = HostkvStorage(StorageConfig(extra_config={
        "backend_name": "hostkv", "module_path": "hostkv.sglang.storage",
        "class_name": "HostkvStorage", "interface_v1": True, "target": target}), {})
    storage.register_mem_pool_host(host)
    return device, host, storage


def prompt():
    """The prompt's tokens and the KV engine 1 computes for them."""
    g = torch.Generator().manual_seed(2024)
    tokens = torch.randint(0, 150_000, (PROMPT,), generator=g).tolist()
    kv = torch.randn((2, LAYERS, PROMPT, 8, 128), generator=g).to(torch.bfloat16)
    return tokens, kv


def engine_one(target):
    device, host, storage = engine(target)
    tokens, kv = prompt()
    slots = torch.arange(PROMPT)
    for layer in range(LAYERS):                    # "prefill": KV into device slots
        device.k_buffer[layer][slots] = kv[0, layer]
        device.v_buffer[layer][slots] = kv[1, layer]
    host_idx = host.alloc(PROMPT)
    host.backup_from_device_all_layer(device, host_idx, slots, "kernel")
    stored = storage.batch_set_v1(page_keys(tokens), host_idx)
    print(f"engine 1 (pid {os.getpid()}): published {sum(stored)} pages in "
          f"{storage.namespace}", flush=True)
    signal.pause()                                 # until killed


def engine_two(target):
    device, host, storage = engine(target)
    tokens, kv = prompt()
    keys = page_keys(tokens)
    hits = storage.batch_exists(keys)
    print(f"engine 2 (pid {os.getpid()}): {hits} of {len(keys)} pages found in hostkvd")
    host_idx = host.alloc(hits * PAGE)
    loaded = storage.batch_get_v1(keys[:hits], host_idx)
    print(f"loaded {sum(loaded)} pages into host slots {int(host_idx[0])}.."
          f"{int(host_idx[-1])}")
    slots = torch.arange(512, 512 + hits * PAGE)   # the prefix lands in other slots
    ok = hits == len(keys)
    for layer in range(LAYERS):
        host.load_to_device_per_layer(device, host_idx, slots, layer, "kernel")
        same = (torch.equal(device.k_buffer[layer][slots], kv[0, layer]) and
                torch.equal(device.v_buffer[layer][slots], kv[1, layer]))
        print(f"layer {layer} on the device: {'bytes match' if same else 'MISMATCH'}")
        ok = ok and same
    host.free(host_idx)
    storage.close()
    host.close()
    return ok


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--engine-one":
        engine_one(sys.argv[2])
        return
    target = (sys.argv[1] if len(sys.argv) > 1 else os.environ.get("HOSTKV_TARGET")
              or hostkv.DEFAULT_TARGET)
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--engine-one",
                              target], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        if not line.startswith("engine 1"):
            sys.exit(f"engine 1 failed: {line!r}")
        print(line, end="")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    print(f"engine 1 killed with SIGKILL (exit {child.returncode})")
    ok = engine_two(target)
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
