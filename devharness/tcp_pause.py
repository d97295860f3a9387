"""A pausable TCP proxy in front of vLLM that can hold back the answer to one marked request.

A test needs a stream that stays in flight through the agent for as long as it takes
to push, flip and check, then ends normally with its full text. A stream "long enough"
is a bet on the machine's speed (one ended before the swap on a faster machine), and
a client that stops reading does not hold it either: the kernel buffers megabytes of
a loopback connection. So the agent talks to vLLM through this proxy, which passes
every byte both ways, except that once a request whose bytes contain ``marker`` has
had its first event answered, the rest of that answer waits until ``release()``.
vLLM generates the whole answer meanwhile; the agent just has not received it.

The proxy runs its own event loop in a thread, so sync fixtures can own it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections import Counter
from collections.abc import Iterator
from urllib.parse import urlsplit

CHUNK = 65536
# What a request carries to be held, and a prompt that carries it.
HOLD_MARKER = "[held by the tcp proxy]"
HELD_PROMPT = f"The registry publishes {HOLD_MARKER}"
# The first event of a streamed answer: what the client waits for before it counts
# the request as started.
FIRST_EVENT = b"data: "
# An HTTP/1.1 request line; the proxy counts them per method and path. Not anchored at
# the start: on a kept-alive connection a request follows the previous body (which ends
# with no line break) on the same "line".
_REQUEST_LINE = re.compile(rb"(GET|POST|PUT|DELETE|HEAD|PATCH|OPTIONS) (\S+) HTTP/1\.[01]$")
# The longest partial line kept between two reads (a request line is far shorter; a
# long line is a body, whose tail is all that needs keeping).
_MAX_LINE = 8192


class PausableTcpProxy:
    def __init__(self, target_url: str, marker: bytes = HOLD_MARKER.encode(),
                 first_event: bytes = FIRST_EVENT) -> None:
        target = urlsplit(target_url)
        assert target.hostname is not None and target.port is not None, target_url
        self.target = (target.hostname, target.port)
        self.marker = marker
        # What must have come back before a marked answer is held; b"" holds every
        # answer after the marked request (a stalled NATS: no ack, no PONG).
        self.first_event = first_event
        self.held_connections = 0
        # "GET /metrics" -> how many such requests passed, on every connection.
        self.requests: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="pausable-tcp-proxy")
        self._server: asyncio.Server | None = None
        self._gate = asyncio.Event()
        self._port = 0
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> PausableTcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()

    def hold(self) -> None:
        """From now on, marked answers stop after their first event."""
        self._loop.call_soon_threadsafe(self._gate.clear)

    def release(self) -> None:
        """Let every held answer flow on."""
        self._loop.call_soon_threadsafe(self._gate.set)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold marked answers for the block, and let them go however it ends."""
        self.hold()
        try:
            yield
        finally:
            self.release()

    def __enter__(self) -> PausableTcpProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def _serve(self) -> None:
        self._gate.set()
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self._port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        self._gate.set()
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()

    async def _connection(self, client_r: asyncio.StreamReader,
                          client_w: asyncio.StreamWriter) -> None:
        try:
            upstream_r, upstream_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        marked = asyncio.Event()
        self._writers |= {client_w, upstream_w}
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._requests(client_r, upstream_w, marked))
                group.create_task(self._answers(upstream_r, client_w, marked))
        except* (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in (client_w, upstream_w):
                writer.close()
                self._writers.discard(writer)

    async def _requests(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                        marked: asyncio.Event) -> None:
        tail = b""
        line = b""
        while data := await source.read(CHUNK):
            # The marker may straddle two reads.
            if self.marker in tail + data and not marked.is_set():
                marked.set()
                self.held_connections += 1
            tail = data[-len(self.marker):]
            line = self._count_requests(line + data)
            sink.write(data)
            await sink.drain()
        # The client is done sending: half-close so the answer can still come back.
        with contextlib.suppress(OSError):
            sink.write_eof()

    def _count_requests(self, data: bytes) -> bytes:
        """Count the request lines in ``data``; return its unfinished last line."""
        *lines, rest = data.split(b"\r\n")
        for line in lines:
            found = _REQUEST_LINE.search(line)
            if found is not None:
                self.requests[f"{found[1].decode()} {found[2].decode()}"] += 1
        return rest[-_MAX_LINE:]

    async def _answers(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                       marked: asyncio.Event) -> None:
        answered = False
        while data := await source.read(CHUNK):
            if marked.is_set() and not self.first_event:
                await self._gate.wait()
            sink.write(data)
            await sink.drain()
            if marked.is_set():
                answered = answered or self.first_event in data
                if answered:
                    await self._gate.wait()
        sink.close()
