"""Passing a streamed vLLM response back to the client, and counting requests in flight.

`UpstreamStream` owns three things that must end exactly once, whatever way the stream ends
(last byte sent, vLLM broke off, or the client went away): the upstream response is
closed (so vLLM aborts a generation nobody reads), the request's lease is released
(so a drain can finish), and the request is recorded in the metrics.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping

import anyio
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inference_agent.serving.upstream import UPSTREAM_ERRORS
from inference_agent.serving.upstream_http import UpstreamResponse

# Called once when a passed-back stream ends: (status sent, error reason or None).
StreamDone = Callable[[int, str | None], None]
# Called with each body chunk as it is passed back.
StreamChunk = Callable[[bytes], None]


class Inflight:
    """How many proxied requests are running; shutdown waits for zero."""

    def __init__(self) -> None:
        self.count = 0
        self._zero = asyncio.Event()
        self._zero.set()

    def enter(self) -> None:
        self.count += 1
        self._zero.clear()

    def leave(self) -> None:
        self.count -= 1
        if self.count <= 0:
            self.count = 0
            self._zero.set()

    async def wait_zero(self, timeout_s: float) -> bool:
        """Wait until nothing is in flight; True if it got there within ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._zero.wait()
        except TimeoutError:
            return self.count == 0
        return True


class InflightMiddleware:
    """Counts every request under ``prefix`` from its start to its last byte.

    Pure ASGI rather than per-handler bookkeeping: the ASGI call of a streamed response
    only returns once the stream has ended, so this covers streams with no extra code.
    """

    def __init__(self, app: ASGIApp, inflight: Inflight, prefix: str = "/v1/") -> None:
        self.app = app
        self.inflight = inflight
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        self.inflight.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight.leave()


def stream_error_event(message: str, code: str) -> bytes:
    """An SSE ``data:`` line carrying an OpenAI error, as vLLM itself sends mid-stream."""
    body = {"error": {"message": message, "type": "server_error", "param": None,
                      "code": code}}
    return f"data: {json.dumps(body)}\n\n".encode()


class UpstreamStream(Response):
    """Passes an open streaming answer of vLLM's to the client chunk by chunk."""

    def __init__(self, upstream: UpstreamResponse, headers: Mapping[str, str],
                 on_done: StreamDone, on_chunk: StreamChunk | None = None) -> None:
        self.upstream = upstream
        self.status_code = upstream.status
        self.media_type = upstream.headers.get("content-type", "text/event-stream")
        self.background = None
        self.init_headers(headers)
        self._on_done = on_done
        self._on_chunk = on_chunk
        self._error: str | None = None
        self._complete = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._watch_disconnect, receive, group.cancel_scope)
                await self._pump(send)
                group.cancel_scope.cancel()
        except* OSError:
            # ASGI 2.4 servers raise from send() once the client is gone (the task
            # group wraps it in an ExceptionGroup, hence except*).
            self._error = "client_disconnected"
        finally:
            try:
                # Closing first makes vLLM abort a generation nobody will read (a
                # stream read to its end has already given its connection back).
                self.upstream.close()
            finally:
                self._finish()

    async def _watch_disconnect(self, receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                # After the last body message the server reports the finished response
                # as a disconnect too; only an earlier one means the client left.
                if not self._complete:
                    self._error = self._error or "client_disconnected"
                scope.cancel()
                return

    async def _pump(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        try:
            async for chunk in self.upstream.iter_chunks():
                if self._on_chunk is not None:
                    self._on_chunk(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UPSTREAM_ERRORS as exc:
            # Headers are out, so the status cannot change: tell the client in-band.
            self._error = "vllm_stream_broken"
            message = f"the model server broke off the stream: {exc!r}"
            await send({"type": "http.response.body",
                        "body": stream_error_event(message, "vllm_unavailable"),
                        "more_body": True})
        self._complete = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _finish(self) -> None:
        done, self._on_done = self._on_done, _noop
        done(self.status_code, self._error)


def _noop(status: int, reason: str | None) -> None:
    del status, reason
