"""Stand-in of SWAKVPool in python/sglang/srt/mem_cache/swa_memory_pool.py
at sgl-project/sglang 00381c02 (read_file id 56475685049), as far as a
linker reads it: the device pool of a hybrid sliding-window model, two
pools of per-layer buffers (full_kv_pool for the full-attention layers,
swa_kv_pool for the window layers, indexed by SWA slots of their own) and
layers_mapping {global layer id: (the pool's layer, is a window layer)}.
The layer counter is registered on this wrapper only (the inner pools get
None) and waited on here with the global id (wait_until(layer_id -
start_layer)) before either pool's buffers are handed out.

Like memory_pool.py's classes, it takes pools a test built
(tests/python/sglang_model.DevicePool with the MHATokenToKVPool mixin)
instead of SGLang's constructor arguments.
"""
from .memory_pool import KVCache


class SWAKVPool(KVCache):
    def __init__(self, full_kv_pool, swa_kv_pool, full_attention_layer_ids,
                 swa_attention_layer_ids, page_size):
        self.full_kv_pool, self.swa_kv_pool = full_kv_pool, swa_kv_pool
        self.page_size = page_size
        self.start_layer = 0
        self.full_layer_nums = len(full_attention_layer_ids)
        self.swa_layer_nums = len(swa_attention_layer_ids)
        self.layer_num = self.full_layer_nums + self.swa_layer_nums
        self.layers_mapping = {}
        for local, global_id in enumerate(full_attention_layer_ids):
            self.layers_mapping[global_id] = (local, False)
        for local, global_id in enumerate(swa_attention_layer_ids):
            self.layers_mapping[global_id] = (local, True)

    def register_layer_transfer_counter(self, layer_transfer_counter):
        self.layer_transfer_counter = layer_transfer_counter
        self.full_kv_pool.register_layer_transfer_counter(None)
        self.swa_kv_pool.register_layer_transfer_counter(None)

    def _pool(self, layer_id):
        self._wait_for_layer(layer_id)
        local, is_window = self.layers_mapping[layer_id]
        return (self.swa_kv_pool if is_window else self.full_kv_pool), local

    def get_key_buffer(self, layer_id):
        pool, local = self._pool(layer_id)
        return pool.get_key_buffer(local)

    def get_value_buffer(self, layer_id):
        pool, local = self._pool(layer_id)
        return pool.get_value_buffer(local)

    def get_kv_buffer(self, layer_id):
        pool, local = self._pool(layer_id)
        return pool.get_kv_buffer(local)
