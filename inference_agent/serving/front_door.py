"""The generation routes straight from the ASGI server; everything else through Starlette.

Every proxied request is a POST to one of two paths. Starlette's layers in front of
such a request (its error middleware, the in-flight count, the exception middleware,
the router's matching, the ``Request`` and the handler wrappers) cost CPU on every
request; here those two paths go from the server to the proxy's handler with the body
read and the headers wrapped once. Any other method or path, and the lifespan, go to the
Starlette app, which still routes the two paths too (so a GET there is its 405).
Why: docs/decisions.md#the-generation-routes-skip-starlette

Before a byte of the body is read, ``admit`` checks the request from its headers (the
proxy's: shutting down, the inference token), so an unauthenticated client cannot make
the agent read or hold a body; then the body is read up to ``max_body_bytes`` (a larger
``Content-Length`` is refused without reading, a chunked body as it crosses the limit).
A refusal made with the body unread closes the connection after it.

An exception escaping the handler is the server's to answer (uvicorn answers 500 and
logs it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.datastructures import Headers, State
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from inference_agent.serving.streams import Inflight

GENERATION_PATHS = frozenset(("/v1/completions", "/v1/chat/completions"))
# The largest generation request body read by default (AgentSettings.max_body_bytes).
DEFAULT_MAX_BODY_BYTES = 16 * 1024**2
# (headers, body, path) -> the response to send.
Generate = Callable[[Headers, bytes, str], Awaitable[Response]]
# Writes a response some faster way than ASGI; False if it did not (direct_protocol.py).
SendWhole = Callable[[Response], Awaitable[bool]]
# A request judged from its headers alone, before its body is read: its refusal, or None.
Admit = Callable[[Headers], Response | None]
# The refusal of a body over the limit (given).
TooLarge = Callable[[int], Response]


class OverLimit:
    """What ``read_body`` returns for a body over its limit (the rest left unread)."""


OVER_LIMIT = OverLimit()


async def read_body(receive: Receive, limit: int | None = None,
                    declared: str | None = None) -> bytes | OverLimit | None:
    """The request's body, None if the client left before it was all in, or
    ``OVER_LIMIT`` once it is known to be over ``limit`` bytes: at once from its
    ``Content-Length`` (``declared``), else as it arrives."""
    if limit is not None and declared is not None and declared.isdigit() and (
            int(declared) > limit):
        return OVER_LIMIT
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            return OVER_LIMIT
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class FrontDoor:
    """ASGI app: POSTs to ``GENERATION_PATHS`` to ``generate``, the rest to ``app``.

    ``admit`` (optional) judges a generation POST from its headers before its body is
    read; ``max_body_bytes`` (optional) bounds the body, ``too_large`` answering one
    over it."""

    def __init__(self, app: Starlette, generate: Generate, inflight: Inflight, *,
                 admit: Admit | None = None, too_large: TooLarge | None = None,
                 max_body_bytes: int | None = None) -> None:
        self.app = app
        self.generate = generate
        self.inflight = inflight
        self.admit = admit
        self.too_large = too_large or _too_large
        self.max_body_bytes = max_body_bytes

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
            headers = Headers(scope=scope)
            refusal = self.admit(headers) if self.admit is not None else None
            if refusal is None:
                body = await read_body(receive, self.max_body_bytes,
                                       headers.get("content-length"))
                if body is None:
                    return  # nobody to answer
                if isinstance(body, OverLimit):
                    assert self.max_body_bytes is not None
                    refusal = self.too_large(self.max_body_bytes)
            if refusal is not None:
                # The body (or its rest) is never read: the connection cannot carry
                # another request, and uvicorn closes it after this answer.
                refusal.headers["connection"] = "close"
                await refusal(scope, receive, send)
                return
            assert isinstance(body, bytes)
            response = await self.generate(headers, body, scope["path"])
            if send_whole is None or not await send_whole(response):
                await response(scope, receive, send)
        finally:
            self.inflight.leave()


def _too_large(limit: int) -> Response:
    return JSONResponse({"error": {"message": f"the request body is over {limit} bytes",
                                   "type": "invalid_request_error", "param": None,
                                   "code": "body_too_large"}}, status_code=413)
