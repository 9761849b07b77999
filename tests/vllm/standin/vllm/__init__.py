"""A stand-in of the parts of vLLM (v0.26 and later, the "C2" offloading
API) that a third-party OffloadingSpec meets, rebuilt in our own code from
facts read in vllm-project/vllm (client/python/hostkv/vllm/NOTES-v026.md).
Module paths mirror vLLM's; each module's docstring names the upstream file
and commit it models:
  v1/kv_offload/base.py      base.py @0105e232
  v1/kv_offload/config.py    config.py, the form with OffloadingGroupConfig.group_id
  v1/kv_offload/factory.py   factory.py, the create_spec(config) form
  distributed/kv_transfer/kv_connector/v1/offloading/
    scheduler.py             scheduler.py @0105e232 (full attention, sliding window)
    worker.py                worker.py @0078e9d2
    common.py                common.py @03f97cce
    config.py                build_offloading_config @006f89ac
  v1/kv_cache_interface.py, v1/metrics/cache_hit_source.py,
  distributed/kv_events.py   the few names those files import
tests/vllm/engine.py drives it; put tests/vllm/standin first on sys.path.
"""
