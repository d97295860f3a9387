"""The serving path: the OpenAI-compatible front door, its routes, leases and streams."""
