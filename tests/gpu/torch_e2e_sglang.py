"""The torch_e2e check's third engine: SGLang's host-pool classes
(hostkv.sglang) over CUDA device pools, driven as HiCache's controller
drives them: a backup on a write stream right after the KV is written, with
CUDA index tensors (no host sync: the call returns while the late KV is
still being written, and the daemon's copy waits for mark_kv_written), then per-layer
loads on a load stream with an event recorded after each call, which the
compute stream waits on before it reads the layer. Bytes compared.
"""
import torch

from hostkv.sglang import RemoteMHATokenToKVPoolHost, RemoteMLATokenToKVPoolHost


class CudaDevicePool:
    """SGLang's MHATokenToKVPool / MLATokenToKVPool, as a host pool sees it."""

    def __init__(self, attention, size=1024, page_size=16, layer_num=4):
        self.size, self.page_size, self.layer_num = size, page_size, layer_num
        self.store_dtype = self.dtype = torch.bfloat16
        self.start_layer, self.end_layer = 0, layer_num - 1
        self.device = "cuda"
        rows = size + page_size
        if attention == "mha":
            self.head_num, self.head_dim = 8, 128
            self.k_buffer = [torch.zeros(rows, 8, 128, dtype=self.dtype, device="cuda")
                             for _ in range(layer_num)]
            self.v_buffer = [torch.zeros_like(t) for t in self.k_buffer]
            self.planes = self.k_buffer + self.v_buffer
        else:
            self.kv_lora_rank, self.qk_rope_head_dim = 512, 64
            self.kv_buffer = [torch.zeros(rows, 1, 576, dtype=self.dtype, device="cuda")
                              for _ in range(layer_num)]
            self.planes = self.kv_buffer


def check(cls, attention, layout, target):
    device = CudaDevicePool(attention)
    host = cls(device, 2.0, 0, device.page_size, layout, target=target)
    try:
        tokens = 256
        src = torch.arange(tokens, device="cuda")
        dst = torch.arange(512, 512 + tokens, device="cuda")
        host_idx = host.alloc(tokens)
        write = torch.cuda.Stream()
        with torch.cuda.stream(write):
            torch.cuda._sleep(50_000_000)  # the KV lands late: the backup must wait for it
            for t in device.planes:
                t[:tokens].normal_()
            expected = [t[:tokens].clone() for t in device.planes]
            # As the controller's move_indices: host indices on the device too.
            host.backup_from_device_all_layer(device, host_idx.to("cuda", non_blocking=True),
                                              src, "kernel")
            # Nothing in the call waited for the stream (no index copy to the
            # host, no RPC on this thread): the late KV is still being written.
            if write.query():
                raise RuntimeError(f"{attention} {layout}: backup_from_device_all_layer "
                                   "synchronized with the KV's stream")
        write.synchronize()
        for t in device.planes:
            t.fill_(7.0)
        load, compute = torch.cuda.Stream(), torch.cuda.current_stream()
        load.wait_stream(compute)  # as the controller's load stream waits on compute
        events, got = [], []
        with torch.cuda.stream(load):
            host_idx_cuda = host_idx.to("cuda", non_blocking=True)  # move_indices
            for layer in range(device.layer_num):
                host.load_to_device_per_layer(device, host_idx_cuda, dst, layer, "kernel",
                                              is_draft=False)
                event = torch.cuda.Event()
                event.record()
                events.append(event)
        per_layer = len(device.planes) // device.layer_num
        for layer in range(device.layer_num):
            compute.wait_event(events[layer])
            for plane in range(per_layer):
                got.append(device.planes[plane * device.layer_num + layer][dst].clone())
        torch.cuda.synchronize()
        want = [expected[plane * device.layer_num + layer]
                for layer in range(device.layer_num) for plane in range(per_layer)]
        bad = [i for i, (a, b) in enumerate(zip(want, got)) if not torch.equal(a, b)]
        if bad:
            raise RuntimeError(f"{attention} {layout}: pieces {bad} differ after the load")
        return sum(t.numel() * t.element_size() for t in want)
    finally:
        host.close()


def run(target):
    moved = check(RemoteMHATokenToKVPoolHost, "mha", "layer_first", target)
    moved += check(RemoteMLATokenToKVPoolHost, "mla", "page_first", target)
    print(f"sglang classes: MHA layer_first + MLA page_first, {moved} bytes match", flush=True)
    return 0
