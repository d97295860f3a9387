"""The generation routes straight from the ASGI server; everything else through Starlette.

Every proxied request is a POST to one of two paths. Starlette's layers in front of
such a request (its error middleware, the in-flight count, the exception middleware,
the router's matching, the ``Request`` and the handler wrappers) were about 8% of the
agent's CPU per request against a stand-in vLLM (``bench/proxy_cpu.py``); here those
two paths go from the server to the proxy's handler with the body read and the
headers wrapped once. Any other method or path, and the lifespan, go to the Starlette
app, which still routes the two paths too (so a GET there is its 405).

An exception escaping the handler is the server's to answer (uvicorn answers 500 and
logs it), as it was Starlette's error middleware's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.datastructures import Headers, State
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from inference_agent.serving.streams import Inflight

GENERATION_PATHS = frozenset(("/v1/completions", "/v1/chat/completions"))
# (headers, body, path) -> the response to send.
Generate = Callable[[Headers, bytes, str], Awaitable[Response]]
# Writes a response some faster way than ASGI; False if it did not (direct_protocol.py).
SendWhole = Callable[[Response], Awaitable[bool]]


async def read_body(receive: Receive) -> bytes | None:
    """The request's body, or None if the client left before it was all in."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


class FrontDoor:
    """ASGI app: POSTs to ``GENERATION_PATHS`` to ``generate``, the rest to ``app``."""

    def __init__(self, app: Starlette, generate: Generate, inflight: Inflight) -> None:
        self.app = app
        self.generate = generate
        self.inflight = inflight

    @property
    def state(self) -> State:
        return self.app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST"
                or scope["path"] not in GENERATION_PATHS):
            await self.app(scope, receive, send)
            return
        await self.serve(scope, receive, send)

    async def serve(self, scope: Scope, receive: Receive, send: Send,
                    send_whole: SendWhole | None = None) -> None:
        """Answer a generation POST, through ``send_whole`` where it takes the answer."""
        self.inflight.enter()
        try:
            body = await read_body(receive)
            if body is None:
                return  # nobody to answer
            response = await self.generate(Headers(scope=scope), body, scope["path"])
            if send_whole is None or not await send_whole(response):
                await response(scope, receive, send)
        finally:
            self.inflight.leave()
