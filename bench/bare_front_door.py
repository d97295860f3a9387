"""The agent's proxy behind a bare HTTP/1.1 protocol instead of uvicorn: a measure of
what the ASGI server and the front door's layers cost a proxied request.

``bench/proxy_cpu.py --bare`` runs this checkout's proxy (the same ``Proxy.generate``:
token, JSON body, route, lease, the upstream client, metrics) behind this protocol,
in the same rounds as behind uvicorn. Each request's body is read with httptools,
handed to ``generate`` with its headers in a dict, and the answer written in one
``write``: no scope, no ASGI messages, no Starlette ``Headers``, no middleware.

It is a bench's stand-in, not a server: it answers only what the bench sends
(keep-alive POSTs with a length, one at a time per connection, and ``/healthz``); no
pipelining, ``Expect: 100-continue``, streamed answers, timeouts or graceful shutdown,
which uvicorn gives the agent. Its figure is how much of the agent's CPU a front door
without those layers could save, not a front door ready to use.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools

_HEALTHY = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


class BareFrontDoor(asyncio.Protocol):
    """One client connection: its requests parsed with httptools, answered by
    ``generate(headers, body, path)``."""

    def __init__(self, generate: Any) -> None:
        self.generate = generate
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        path = self.url.decode("latin-1")
        if path == "/healthz":
            self.transport.write(_HEALTHY)
            return
        asyncio.get_running_loop().create_task(
            self._answer(path, self.headers, b"".join(self.body)))

    async def _answer(self, path: str, headers: dict[str, str], body: bytes) -> None:
        response = await self.generate(headers, body, path)
        head = [b"HTTP/1.1 %d \r\n" % response.status_code]
        head += [name + b": " + value + b"\r\n" for name, value in response.raw_headers]
        assert self.transport is not None
        self.transport.write(b"".join(head) + b"\r\n" + response.body)


async def serve(generate: Any, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(
        lambda: BareFrontDoor(generate), "127.0.0.1", port)
    await server.serve_forever()
