"""Stand-in of vLLM's offloading connector package (scheduler, worker, common, config)."""
