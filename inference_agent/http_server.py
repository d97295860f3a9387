"""The agent's HTTP server: uvicorn, without its signal handlers and its timer.

uvicorn's ``main_loop`` wakes every 100 ms to see whether it should exit (and every
tenth wake refreshes the ``date`` header). On a host crowded with processes each
wake-up costs more than its own work: a switch onto a cold cache. Here the loop sleeps
until told to exit, and the ``date`` header is made when a response asks for it (at
most once a second), so an idle agent's server never wakes on a timer.
Why: docs/decisions.md#the-agents-http-server-keeps-no-timer
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Generator
from email.utils import formatdate
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from inference_agent.serving.direct_protocol import GenerationProtocol
from inference_agent.settings import AgentSettings
from loraplane.http_guard import ConnectionLimits, bounded_by_descriptors, with_limits

# uvicorn's own wait for connections, after the agent already waited for its requests.
SERVER_CLOSE_S = 2
# Longer than clients keep an idle connection (httpx, and the OpenAI SDK on it, 5 s;
# a load balancer's idle timeout, often 60 s): the client, not the agent, then closes
# an idle one, and never sends a request on a connection the agent is closing, which
# fails that request (uvicorn's own default is the same 5 s as httpx's).
KEEP_ALIVE_S = 65
# The connection protocol: uvicorn's httptools one, answering generation POSTs in one write.
HTTP_PROTOCOL = GenerationProtocol


def server_config(app: Any, settings: AgentSettings) -> uvicorn.Config:
    """The agent's HTTP server: the OpenAI-compatible port, metrics and health; its
    connections keep to the header timeout and connection cap of the settings."""
    config = uvicorn.Config(app, log_level=settings.log_level, lifespan="on",
                            access_log=False, timeout_graceful_shutdown=SERVER_CLOSE_S,
                            timeout_keep_alive=KEEP_ALIVE_S, http=HTTP_PROTOCOL)
    return with_limits(config, ConnectionLimits(
        header_timeout_s=settings.header_timeout_s,
        max_connections=bounded_by_descriptors(settings.max_connections)))


class DatedState(ServerState):
    """uvicorn's state shared by its connections, whose default headers (``date``, then
    the configured ones) are made when a response reads them, anew in each second;
    uvicorn's main loop otherwise refreshes them on a timer."""

    def __init__(self, config: uvicorn.Config, clock: Callable[[], float] = time.time
                 ) -> None:
        self._config = config
        self._clock = clock
        self._second = -1
        self._headers: list[tuple[bytes, bytes]] = []
        super().__init__()

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        second = int(self._clock())
        if second != self._second:
            date = ([(b"date", formatdate(second, usegmt=True).encode())]
                    if self._config.date_header else [])
            self._headers = date + self._config.encoded_headers
            self._second = second
        return self._headers

    @default_headers.setter
    def default_headers(self, _value: list[tuple[bytes, bytes]]) -> None:
        """uvicorn's own refresh (``on_tick``), and its first empty list: made above."""


class QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers (the agent owns the signals and the order),
    whose main loop sleeps until ``should_exit`` is set."""

    def __init__(self, config: uvicorn.Config,
                 clock: Callable[[], float] = time.time) -> None:
        self._exit = asyncio.Event()
        super().__init__(config)
        self.server_state = DatedState(config, clock)

    @property
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()
        else:
            self._exit.clear()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def main_loop(self) -> None:
        # uvicorn's ticks also check limit_max_requests and call callback_notify, which
        # server_config sets neither of.
        await self._exit.wait()
