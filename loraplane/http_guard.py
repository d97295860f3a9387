"""Connection limits for loraplane's two uvicorn servers (the registry's and the agent's).

uvicorn (0.54) has no timeout for a request's head: its keep-alive timer starts only
after a response and stops at the first byte of the next request, so a client that
sends half a request line and then nothing holds its connection, and a file descriptor,
for as long as it likes, and enough of them exhaust the process's descriptors (issue
35). Its ``limit_concurrency`` answers 503 only once a request's head is in,
which such a client never sends. ``GuardedProtocol`` adds both:

- **A header timeout.** A connection must send a whole request head within
  ``header_timeout_s``: from the moment it is accepted for its first request, from its
  first byte for each later one (between requests the keep-alive timeout governs). A
  client that sent part of a head is answered 408 ``header_timeout`` and closed; one
  that sent nothing is closed.
- **A connection cap.** A connection accepted while ``max_connections`` are open is
  answered 503 ``too_many_connections`` with ``Retry-After`` at once, before anything
  is read, and closed: the cap bounds the descriptors clients can hold, whatever they
  send. ``bounded_by_descriptors`` keeps the cap below the process's descriptor limit.
- **A gentle close.** A connection closed by the server while its client may still be
  sending (refused by the cap, or answered before its body was read: a 401 or 413 the
  application gives with ``Connection: close``) is closed gently: the answer, then the
  server's end shut, and what the client still sends read and dropped (never parsed or
  kept) until it closes, for at most ``LINGER_S``. Closing at once with bytes unread
  makes the kernel reset the connection, and the client could lose the answer. Only
  ``LINGER_ROOM`` connections beyond the cap linger; past that (a flood) they are
  closed at once.

Refusals here carry ``{"error": {"code", "message"}}``, the part the registry's and the
agent's (OpenAI-style) error bodies share.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from asyncio import TimerHandle
from dataclasses import dataclass
from typing import Any, cast

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

log = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 1000
# Descriptors kept for everything but client connections (files, the process's own
# clients, its database or vLLM pool) when the cap is bounded by RLIMIT_NOFILE.
DESCRIPTOR_RESERVE = 128
RETRY_AFTER_S = 1
LINGER_S = 1.0
LINGER_ROOM = 64
_ATTRIBUTE = "loraplane_connection_limits"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS


def bounded_by_descriptors(max_connections: int, reserve: int = DESCRIPTOR_RESERVE) -> int:
    """``max_connections``, lowered (never below 1) to leave ``reserve`` descriptors
    under the soft RLIMIT_NOFILE: the cap then refuses before accept runs out."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft - reserve >= max_connections:
        return max_connections
    bounded = max(1, soft - reserve)
    log.warning("at most %d connections (not %d): the descriptor limit is %d",
                bounded, max_connections, soft)
    return bounded


def with_limits(config: Config, limits: ConnectionLimits) -> Config:
    """``config``, whose connections (a ``GuardedProtocol``) keep to ``limits``."""
    setattr(config, _ATTRIBUTE, limits)
    return config


def limits_of(config: Config) -> ConnectionLimits:
    limits = getattr(config, _ATTRIBUTE, None)
    return limits if isinstance(limits, ConnectionLimits) else ConnectionLimits()


def refusal(status: int, code: str, message: str,
            headers: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """A whole response that closes its connection, as bytes."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = [STATUS_LINE[status]]
    for name, value in (*headers, (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close")):
        head += (name, b": ", value, b"\r\n")
    return b"".join((*head, b"\r\n", body))


class _GentleTransport:
    """A connection's transport whose ``close`` is the protocol's gentle close; the rest
    is the transport's own (``write`` bound once: it is on every answer's path)."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedProtocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self.write = transport.write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()

    def close(self) -> None:
        self._protocol.close_connection()


class GuardedProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` with a header timeout, a connection cap and a gentle close
    (see above)."""

    def __init__(self, config: Config, server_state: ServerState,
                 app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = limits_of(config)
        self.header_timeout_s = limits.header_timeout_s
        self.max_connections = limits.max_connections
        self._header_timer: TimerHandle | None = None
        self._head_begun = False
        self._raw: asyncio.Transport | None = None
        self.lingering = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._raw = transport
        self.transport = cast(asyncio.Transport, _GentleTransport(transport, self))
        open_now = len(self.connections)
        if open_now > self.max_connections:
            self._refuse(open_now)
            return
        self._arm_header_timer()

    def _refuse(self, open_now: int) -> None:
        log.warning("connection refused: %d connections open (the cap)", open_now - 1)
        self.transport.write(refusal(
            503, "too_many_connections",
            "the server has as many connections open as it takes; retry later",
            ((b"retry-after", str(RETRY_AFTER_S).encode()),)))
        self._linger(open_now <= self.max_connections + LINGER_ROOM)

    def close_connection(self) -> None:
        """Close: at once, unless the client may still be sending its request's body."""
        cycle = self.cycle
        self._linger(cycle is not None and cycle.more_body and not cycle.disconnected
                     and len(self.connections) <= self.max_connections + LINGER_ROOM)

    def _linger(self, gently: bool) -> None:
        raw = self._raw
        assert raw is not None
        if self.lingering or raw.is_closing():
            return
        if not gently or not raw.can_write_eof():
            raw.close()
            return
        # Until the client closes (eof_received: the transport closes) or LINGER_S.
        self.lingering = True
        raw.write_eof()
        raw.resume_reading()
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(LINGER_S, raw.close)

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return  # dropped unread: the connection carries nothing more
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_begun = True
        if self._header_timer is None:
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        self._head_begun = False
        super().on_headers_complete()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s,
                                                  self._header_timed_out)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self._head_begun:
            self.transport.write(refusal(
                408, "header_timeout",
                f"the request's head did not arrive within {self.header_timeout_s:g} s"))
        self.transport.close()
