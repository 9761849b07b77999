"""Stand-in package (see tests/vllm/standin/README.md)."""
