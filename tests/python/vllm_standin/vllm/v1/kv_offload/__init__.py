"""Stand-in of the vllm/v1/kv_offload package (v0.19-v0.20 layout)."""
