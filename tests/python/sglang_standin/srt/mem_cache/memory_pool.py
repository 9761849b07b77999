"""Stand-in of python/sglang/srt/mem_cache/memory_pool.py: the device KV
pool classes as managers/cache_controller.py @001067ff and
mem_cache/hiradix_cache.py @39baee9e see them. Not read from one commit:
these are the names and the one behaviour those two files rely on.

- the class names they test with isinstance (MHATokenToKVPool,
  MLATokenToKVPool, HybridLinearKVPool with .full_kv_pool);
- KVCache.register_layer_transfer_counter(counter), which the controller
  calls in its constructor with its LayerDoneCounter; the pool then waits,
  before it hands out layer i's buffers, for the counter's layer i
  (counter.wait_until(layer_id - start_layer)), as SGLang's pools do;
- MHATokenToKVPool.v_head_dim (get_mha_host_pool_cls compares it with
  head_dim; it is head_dim unless set).

The classes are mixins without __init__: a test combines them with its own
pool (tests/python/sglang_model.DevicePool), which has SGLang's device
pool attributes (size, page_size, layer_num, store_dtype, device,
start_layer, k_buffer / v_buffer or kv_buffer of size + page_size rows).
"""


class KVCache:
    layer_transfer_counter = None

    def register_layer_transfer_counter(self, layer_transfer_counter):
        self.layer_transfer_counter = layer_transfer_counter

    def _wait_for_layer(self, layer_id):
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)


class MHATokenToKVPool(KVCache):
    @property
    def v_head_dim(self):
        return self.__dict__.get("_v_head_dim", self.head_dim)

    @v_head_dim.setter
    def v_head_dim(self, value):
        self.__dict__["_v_head_dim"] = value

    def get_key_buffer(self, layer_id):
        self._wait_for_layer(layer_id)
        return self.k_buffer[layer_id - self.start_layer]

    def get_value_buffer(self, layer_id):
        self._wait_for_layer(layer_id)
        return self.v_buffer[layer_id - self.start_layer]

    def get_kv_buffer(self, layer_id):
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)


class MLATokenToKVPool(KVCache):
    def get_key_buffer(self, layer_id):
        self._wait_for_layer(layer_id)
        return self.kv_buffer[layer_id - self.start_layer]

    def get_kv_buffer(self, layer_id):
        buf = self.get_key_buffer(layer_id)
        return buf, buf[..., :self.kv_lora_rank]


class HybridLinearKVPool(KVCache):
    """Only its name and .full_kv_pool (the controller unwraps it)."""

    full_kv_pool = None
