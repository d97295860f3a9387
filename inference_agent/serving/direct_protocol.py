"""uvicorn's httptools protocol, answering the generation POSTs in one write.

Behind uvicorn, a proxied answer goes out as two ASGI messages: the start (its headers
checked, lower-cased and joined one by one) and the body, each its own ``write``, so
two ``send`` system calls a request. Here uvicorn keeps everything it does for a
connection (parsing, keep-alive and its timeout, pipelining, flow control,
``Expect: 100-continue``, graceful shutdown, the 500 for a handler that raises); only
the answer of a generation POST whose response is a whole body is written by this
module: the status line, uvicorn's default headers, the response's and the body, in
one ``write``. Streamed answers, and any response this module does not know how to
write, go through uvicorn's ASGI ``send``.
Why: docs/decisions.md#generation-answers-are-written-in-one-write-from-uvicorns-protocol

These requests skip the app's ASGI middleware that uvicorn wraps around the app
(``--proxy-headers``): it rewrites the scope's client and scheme, which the
generation handler does not read.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable
from typing import Any

from starlette.responses import Response
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from inference_agent.serving.front_door import GENERATION_PATHS, FrontDoor
from loraplane.http_guard import GuardedProtocol

# Statuses whose answer has no body (and no content-length from Starlette).
_BODILESS = frozenset((204, 304))


class GenerationProtocol(GuardedProtocol):
    """uvicorn's ``HttpToolsProtocol`` that runs generation POSTs through
    ``FrontDoor.serve`` with a writer for whole answers; the app it serves must be a
    ``FrontDoor``. Its connections keep to ``loraplane.http_guard``'s header timeout and
    connection cap."""

    def __init__(self, config: Config, server_state: ServerState,
                 app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        door = config.app
        self.door = door if isinstance(door, FrontDoor) else None

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        scope = cycle.scope
        # ``app`` is uvicorn's 503 when over --limit-concurrency: that answer stays its,
        # as do a task run in a context of its own (``reset_contextvars``) and the
        # answers of a connection whose responses go to the access log.
        if (self.door is None or app is not self.app or scope["method"] != "POST"
                or scope["path"] not in GENERATION_PATHS
                or self.config.reset_contextvars or self.access_log):
            super()._start_asgi_task(cycle, app)
            return
        serve = functools.partial(self.door.serve,
                                  send_whole=functools.partial(write_whole, cycle))
        # run_asgi: a handler that raises is uvicorn's 500 (or a closed connection).
        task = self.loop.create_task(cycle.run_asgi(serve))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)


async def write_whole(cycle: RequestResponseCycle, response: Response) -> bool:
    """Write ``response`` on ``cycle``'s connection in one ``write``, as uvicorn's
    ``send`` would have in two; False (nothing written) if it is not a plain whole
    body this knows how to write."""
    if not _plain(response, cycle):
        return False
    if cycle.keep_alive and _client_closes(cycle.scope["headers"]):
        cycle.keep_alive = False
    head = _head(cycle, response)
    if cycle.flow.write_paused and not cycle.disconnected:
        await cycle.flow.drain()
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    if cycle.disconnected:
        return True  # nobody to answer, as uvicorn's send
    cycle.transport.write(head + response.body)
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()
    return True


def _plain(response: Response, cycle: RequestResponseCycle) -> bool:
    # Response.__call__ sends exactly the start with raw_headers, then the body; a
    # subclass that sends otherwise (streams, files) has its own __call__. A response's
    # own ``connection`` header stays uvicorn's to handle.
    status = response.status_code
    return (type(response).__call__ is Response.__call__ and response.background is None
            and 200 <= status < 600 and status not in _BODILESS
            and not cycle.response_started
            and all(name != b"connection" for name, _ in response.raw_headers))


def _head(cycle: RequestResponseCycle, response: Response) -> bytes:
    """The status line and headers, as uvicorn's ``send`` writes them."""
    content = [STATUS_LINE[response.status_code]]
    for name, value in cycle.default_headers:
        content += (name, b": ", value, b"\r\n")
    for name, value in response.raw_headers:
        if HEADER_RE.search(name) or HEADER_VALUE_RE.search(value):
            # Refused as uvicorn refuses them: no header injected through a header.
            raise RuntimeError("Invalid HTTP header.")
        content += (name, b": ", value, b"\r\n")
    if not cycle.keep_alive:
        content.append(b"connection: close\r\n")
    content.append(b"\r\n")
    return b"".join(content)


def _client_closes(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """The request's own ``Connection: close``: uvicorn before 0.53 leaves it to its
    ``send`` rather than to the cycle's ``keep_alive``."""
    for name, value in headers:
        if name == b"connection" and b"close" in (
                token.strip().lower() for token in value.split(b",")):
            return True
    return False
