"""The agent's uvicorn server: a main loop that wakes once a tick, or when told to stop."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import uvicorn

from devharness.waiting import eventually
from inference_agent import http_server
from inference_agent.http_server import QuietServer
from loraplane.netutil import free_port
from tests.agent.loop_support import running


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _server(port: int) -> QuietServer:
    return QuietServer(uvicorn.Config(_ok, host="127.0.0.1", port=port,
                                      log_level="warning", lifespan="off"))


async def test_it_stops_when_told_without_waiting_for_a_tick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "TICK_S", 3600.0)  # only the stop can end the wait
    port = free_port()
    server = _server(port)
    async with running(server) as task:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{port}/")
        assert response.status_code == 200 and response.headers.get("date")
        assert not server.should_exit
        server.should_exit = True
        await asyncio.wait_for(task, 60)  # an hour's tick would fail this
    assert task.done() and task.exception() is None


async def test_every_tick_refreshes_the_date_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "TICK_S", 0.01)
    server = _server(free_port())
    counters: list[int] = []
    real = server.on_tick

    async def counted(counter: int) -> bool:
        counters.append(counter)
        return await real(counter)

    monkeypatch.setattr(server, "on_tick", counted)
    async with running(server):
        await eventually(lambda: len(counters) >= 4, timeout_s=60, what="four ticks")
    # uvicorn refreshes its date header when the counter is a multiple of ten.
    assert all(c % 10 == 0 for c in counters) and len(set(counters)) == len(counters)
