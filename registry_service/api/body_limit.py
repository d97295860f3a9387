"""A size limit on every request body but an upload's, enforced before anything parses it.

FastAPI reads a JSON body whole into memory before it authenticates the caller, so the
limit is a pure ASGI middleware: a ``Content-Length`` over it is answered at once without
reading a byte, and a body without one (chunked) is counted as it arrives and cut off at
the limit. Uploads stream to disk under their own limits (``versions/upload.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from registry_service.api.errors import error_response

# Bodies streamed to disk by their route, each under limits of its own.
STREAMED_BODIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("POST", re.compile(r"/v1/adapters/[^/]+/versions/?")),
)


class _BodyTooLarge(Exception):
    """Raised into the app by ``receive`` once the body crossed the limit."""


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class BodyLimitMiddleware:
    """Answer 413 ``body_too_large`` to a body over ``limit()`` bytes.

    ``limit`` is read on every request, so the settings object stays the one source.
    """

    def __init__(self, app: ASGIApp, limit: Callable[[], int]) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _streamed(scope):
            await self.app(scope, receive, send)
            return
        limit = self.limit()
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            await _refuse(scope, receive, send, limit)
            return
        await _Guarded(self.app, limit).run(scope, receive, send)


def _streamed(scope: Scope) -> bool:
    path = scope.get("path", "")
    return any(scope.get("method") == method and pattern.fullmatch(path)
               for method, pattern in STREAMED_BODIES)


class _Guarded:
    """One request whose body is counted; past the limit the app's answer is replaced."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit
        self.received = 0
        self.tripped = False
        self.started = False

    async def run(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.received += len(message.get("body", b""))
                if self.received > self.limit:
                    self.tripped = True
                    raise _BodyTooLarge
            return message

        async def sent(message: Message) -> None:
            # Whatever the app made of the cut-off body (FastAPI calls it a parse error)
            # is dropped: the client hears 413.
            if not self.tripped:
                self.started = True
                await send(message)

        try:
            await self.app(scope, counted, sent)
        except _BodyTooLarge:
            pass
        except Exception:
            if not self.tripped:
                raise
        if self.tripped and not self.started:
            await _refuse(scope, receive, send, self.limit)


async def _refuse(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    # ``Connection: close``: the rest of the body is never read, so the connection
    # cannot carry another request.
    response = error_response(413, "body_too_large",
                              f"the request body is over {limit} bytes",
                              {"limit": limit}, headers={"Connection": "close"})
    await response(scope, receive, send)
