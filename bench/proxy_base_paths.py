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

from bench.proxy_cpu import start_role
from devharness.processes import http_probe
from loraplane.netutil import free_port

READY_TIMEOUT_S = 60.0
# path name -> proxy_cpu's role serving it
ROLES = {"app (base)": "--serve-agent", "bare (base)": "--serve-bare"}


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
        for name, role in ROLES.items():
            port = free_port()
            process = start_role([role, str(port), str(upstream_port)],
                                 name.split(" ", 1)[0], None, work)
            stack.callback(process.stop, 10)
            url = f"http://127.0.0.1:{port}"
            process.wait_ready(http_probe(f"{url}/healthz"), READY_TIMEOUT_S, interval_s=0.2)
            assert process.pid is not None
            proxies.append(BaseProxy(name, url, process.pid, streams=role != "--serve-bare"))
        yield proxies


