"""Stand-in of vllm/v1/kv_offload (vLLM v0.26+ layout: base, config, factory)."""
