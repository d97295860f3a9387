"""The paths ``bench/agent_proxy_overhead.py --base-paths`` adds: the agent's proxy with
and without its HTTP server's layers, in front of the same vLLM, for the base model.

- ``vllm (base)``: vLLM itself, ``model=tiny-llama`` (the base model, no adapter);
- ``app (base)``: the agent's proxy app alone under uvicorn with the agent's connection
  protocol (``bench/proxy_cpu.py --serve-agent``): the same token check, JSON body,
  route, upstream client and metrics as the agent's, for the base model;
- ``bare (base)``: the very same proxy's ``generate`` behind ``bench/bare_front_door.py``
  (``--serve-bare``): no ASGI server, no scope, no cycle, no task per request from it.

Each is compared with ``vllm (base)`` in the same rounds (``proxy_stats.baseline_of``).
``bare (base)`` sits out streamed workloads: the bare front door answers no streams.
``bare (base)`` bounds what any front door in front of this proxy's Python could reach
here: what it adds over vLLM is the proxy's own per-request work and its two hops
through the event loop, with no HTTP server's layers around them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench.proxy_cpu import start_proxy

# path name -> (proxy_cpu's role serving it, whether it answers streams)
ROLES = {"app (base)": ("--serve-agent", True), "bare (base)": ("--serve-bare", False)}


@dataclass(frozen=True)
class BaseProxy:
    name: str  # a path's name; its first word names the process (proxy_stats.process_of)
    url: str
    pid: int
    streams: bool  # the bare front door answers no streams: it sits out those workloads


@contextmanager
def base_proxies(vllm_url: str, work: Path) -> Iterator[list[BaseProxy]]:
    """The proxy app under uvicorn and behind the bare front door, each in front of
    ``vllm_url``, ready; stopped afterwards."""
    upstream_port = urlsplit(vllm_url).port
    if upstream_port is None:
        raise ValueError(f"no port in vLLM's URL {vllm_url!r}")
    work.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        proxies = []
        for name, (role, streams) in ROLES.items():
            url, pid = start_proxy(stack, role, name, upstream_port, work)
            proxies.append(BaseProxy(name, url, pid, streams))
        yield proxies
