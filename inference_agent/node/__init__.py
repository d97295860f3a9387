"""The node: what this host holds (vLLM, the disk cache) and its clients."""
