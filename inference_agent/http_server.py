"""The agent's HTTP server: uvicorn, without its signal handlers and its 10 Hz poll.

uvicorn's ``main_loop`` wakes every 100 ms to see whether it should exit (and every
tenth wake refreshes the ``date`` header). An agent is one process per host, but a
host crowded with processes, or the fan-out bench's hundred agents on two cores,
pays for each wake-up beyond its few microseconds of work: caches cold after the
switch (bench/agent_push_cpu.py counts an agent's wake-ups per push). Here the loop
wakes once a second, for the header, and at once when told to exit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator
from typing import Any

import uvicorn

from inference_agent.settings import AgentSettings

# uvicorn's own wait for connections, after the agent already waited for its requests.
SERVER_CLOSE_S = 2
# Longer than clients keep an idle connection (httpx, and the OpenAI SDK on it, 5 s;
# a load balancer's idle timeout, often 60 s): the client, not the agent, then closes
# an idle one, and never sends a request on a connection the agent is closing, which
# fails that request (uvicorn's own default is the same 5 s as httpx's).
KEEP_ALIVE_S = 65
# How often the main loop wakes when nothing tells it to exit.
TICK_S = 1.0
# uvicorn's on_tick refreshes the date header on every tenth of its 0.1 s ticks.
_TICKS_PER_REFRESH = 10


def server_config(app: Any, settings: AgentSettings) -> uvicorn.Config:
    """The agent's HTTP server: the OpenAI-compatible port, metrics and health."""
    return uvicorn.Config(app, log_level=settings.log_level, lifespan="on", access_log=False,
                          timeout_graceful_shutdown=SERVER_CLOSE_S,
                          timeout_keep_alive=KEEP_ALIVE_S)


class QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers (the agent owns the signals and the order),
    whose main loop sleeps a second at a time and wakes when ``should_exit`` is set."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        super().__init__(config)

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
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await self._exit.wait()
            # A multiple of ten: every tick refreshes the date header, as uvicorn's
            # tenth tick does; the counter wraps as uvicorn's does.
            counter = (counter + _TICKS_PER_REFRESH) % 864000
            should_exit = await self.on_tick(counter)
