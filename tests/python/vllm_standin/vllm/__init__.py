"""Stand-in of the `vllm` package (only what the offloading API touches).
Not vLLM: see tests/python/vllm_standin/__init__.py."""
IS_STANDIN = True
