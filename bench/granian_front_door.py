"""The agent's proxy under granian, a well-kept HTTP server in Rust (hyper on tokio),
for ``bench/proxy_cpu.py --granian``: whether moving HTTP parsing and the server's
per-request work out of Python pays at one client.

Two ways in, both granian's embedded server on this process's uvloop loop, HTTP/1.1,
one runtime thread, no access log:

- ``asgi``: the agent's whole proxy app (``create_proxy_app``), as uvicorn serves it;
- ``rsgi``: granian's own interface, its leanest path into Python, with the same
  ``Proxy.generate`` (token, JSON body, route, lease, the upstream client, metrics)
  called straight from it, as ``bench/bare_front_door.py`` does: no ASGI messages.

Granian's Rust threads parse each request and hand it to the Python loop's thread,
then take the answer back: a hand-over between threads each way, which uvicorn (whose
protocol runs in the loop's own thread) does not make.
"""

from __future__ import annotations

import asyncio
from typing import Any

INTERFACES = ("asgi", "rsgi")


class RsgiProxy:
    """An RSGI app answering generation POSTs with ``generate`` and ``/healthz``."""

    def __init__(self, generate: Any) -> None:
        self.generate = generate

    async def __call__(self, scope: Any, protocol: Any) -> None:
        if scope.path == "/healthz":
            protocol.response_bytes(200, [], b"ok")
            return
        body = await protocol()
        headers = {name.lower(): value for name, value in scope.headers.items()}
        response = await self.generate(headers, body, scope.path)
        protocol.response_bytes(
            response.status_code,
            [(name.decode("latin-1"), value.decode("latin-1"))
             for name, value in response.raw_headers],
            response.body)


def serve(app: Any, port: int, interface: str) -> None:
    """``app`` (the proxy app) under granian's embedded server until the process ends."""
    import uvloop  # noqa: PLC0415
    from granian.constants import HTTPModes, Interfaces  # noqa: PLC0415
    from granian.server.embed import Server  # noqa: PLC0415

    if interface not in INTERFACES:
        raise ValueError(f"interface {interface!r}: one of {INTERFACES}")
    target = RsgiProxy(app.state.proxy.generate) if interface == "rsgi" else app
    server = Server(target, address="127.0.0.1", port=port,
                    interface=Interfaces.RSGI if interface == "rsgi" else Interfaces.ASGI,
                    http=HTTPModes.http1, runtime_threads=1, websockets=False,
                    log_access=False)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(server.serve())
