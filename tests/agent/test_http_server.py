"""The agent's uvicorn server: a main loop that sleeps until told to stop, and a date
header made when a response asks for it rather than on a timer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import uvicorn

from inference_agent.http_server import QuietServer
from loraplane.netutil import free_port
from tests.agent.loop_support import running

# 2001-09-09 01:46:40 UTC
EPOCH_1E9 = 1_000_000_000.0


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _server(port: int, clock: Callable[[], float] | None = None) -> QuietServer:
    config = uvicorn.Config(_ok, host="127.0.0.1", port=port, log_level="warning",
                            lifespan="off", headers=[("server-id", "agent-1")])
    return QuietServer(config) if clock is None else QuietServer(config, clock)


async def test_it_stops_when_told() -> None:
    port = free_port()
    server = _server(port)
    async with running(server) as task:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{port}/")
        assert response.status_code == 200 and response.headers.get("date")
        assert not server.should_exit
        server.should_exit = True
        await asyncio.wait_for(task, 60)  # nothing but the stop ends the main loop
    assert task.done() and task.exception() is None


async def test_the_date_header_follows_the_clock_without_a_tick() -> None:
    now = [EPOCH_1E9]
    port = free_port()
    async with running(_server(port, clock=lambda: now[0])), httpx.AsyncClient() as client:
        first = await client.get(f"http://127.0.0.1:{port}/")
        now[0] += 5.5  # no tick runs: only the response can read the new time
        second = await client.get(f"http://127.0.0.1:{port}/")
    assert first.headers["date"] == "Sun, 09 Sep 2001 01:46:40 GMT"
    assert second.headers["date"] == "Sun, 09 Sep 2001 01:46:45 GMT"
    # The configured headers are still sent beside it, as uvicorn's tick made them.
    assert first.headers["server-id"] == second.headers["server-id"] == "agent-1"
