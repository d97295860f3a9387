"""The registry's connections keep to a header timeout and a connection cap, a deeply
nested JSON body is a 400 ``json_too_deep``, and a background task outlives an
``OSError`` (issue 35, High 2 and Medium 14). Loopback only, bounded counts."""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from devharness.http_registry import serve_http
from devharness.services import NatsService
from devharness.waiting import eventually
from loraplane.http_guard import ConnectionLimits, limits_of, with_limits
from loraplane.netutil import free_port
from registry_service import background
from registry_service.background import BackgroundTask
from registry_service.http_body import UncopiedBodyProtocol
from registry_service.server import server_config
from registry_service.settings import RegistrySettings
from tests.cli.conftest import clean_env
from tests.connection_support import (
    connect,
    ensure_descriptors,
    few_descriptors,
    half_requests,
    loopback_socket,
    process_logged,
    ready,
    serving_on,
)

HALF_HEAD = b"POST /v1/adapters HTTP/1.1\r\nHost: registry\r\nAuthoriz"


def test_the_registry_serves_with_its_settings_limits() -> None:
    settings = RegistrySettings(
        database_url="sqlite:///unused.db", port=0, blob_dir="/tmp/unused-blobs",
        nats_url="nats://127.0.0.1:4222", header_timeout_s=3, max_connections=7)
    assert limits_of(server_config(settings)) == ConnectionLimits(3, 7)
    with pytest.raises(ValueError):
        RegistrySettings(database_url="sqlite:///unused.db", header_timeout_s=0)
    with pytest.raises(ValueError):
        RegistrySettings(database_url="sqlite:///unused.db", max_connections=0)


async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@asynccontextmanager
async def serving(limits: ConnectionLimits) -> AsyncIterator[tuple[str, uvicorn.Server]]:
    sock = loopback_socket()
    config = with_limits(uvicorn.Config(_answer, lifespan="off", log_level="warning",
                                        http=UncopiedBodyProtocol), limits)
    server = uvicorn.Server(config)
    async with serving_on(server, sock) as url:
        yield url, server


async def test_half_sent_requests_are_closed_and_the_cap_answers_503() -> None:
    async with serving(ConnectionLimits(header_timeout_s=0.5, max_connections=20)) as (
            url, server):
        hung = [await connect(url) for _ in range(20)]
        for _reader, writer in hung:
            writer.write(HALF_HEAD)
        await eventually(lambda: len(server.server_state.connections) == 20, timeout_s=10,
                         what="twenty connections accepted")
        reader, writer = await connect(url)
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == (
            "too_many_connections")
        answers = await asyncio.wait_for(
            asyncio.gather(*(r.read() for r, _ in hung)), 30)
        assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), answers[0]
        for _reader, hung_writer in hung:
            hung_writer.close()
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/")).text == "ok"


@pytest.mark.parametrize("depth", [200_000, 5_000])
async def test_a_deeply_nested_json_body_is_a_400(tmp_path: Path, nats: NatsService,
                                                   depth: int) -> None:
    deep = b"[" * depth + b"]" * depth
    async with serve_http("embedded", tmp_path / "data", nats) as served:
        client = served.harness.client
        for path, body in (("/v1/adapters", b'{"name": "x", "extra": ' + deep + b"}"),
                           ("/v1/tokens", deep)):
            response = await client.post(path, content=body, headers={
                **served.harness.admin_headers, "Content-Type": "application/json"})
            assert response.status_code == 400, response.text
            assert response.json()["error"]["code"] == "json_too_deep"


class Flaky(BackgroundTask):
    task_name = "flaky"

    def __init__(self) -> None:
        self.runs = 0
        self.settled = asyncio.Event()

    async def _run(self) -> None:
        self.runs += 1
        if self.runs < 3:
            raise OSError(errno.EMFILE, "Too many open files")
        self.settled.set()
        await asyncio.Event().wait()


async def test_a_background_task_outlives_an_os_error(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    monkeypatch.setattr(background, "RESTART_DELAY_S", 0.0)
    monkeypatch.setattr(BackgroundTask, "restart_delay_s", 0.0)
    task = Flaky()
    await task.start()
    try:
        await asyncio.wait_for(task.settled.wait(), 10)
        assert task.runs == 3
        assert task._task is not None and not task._task.done()
    finally:
        await task.stop()


async def test_a_registry_with_few_descriptors_outlives_a_flood_of_half_requests(
        tmp_path: Path) -> None:
    flood = 400
    ensure_descriptors(flood + 100)
    port = free_port()
    env = {**clean_env(), "LORAPLANE_HEADER_TIMEOUT_S": "2",
           "LORAPLANE_MAX_CONNECTIONS": "100000"}
    argv = [*few_descriptors("loraplane_cli"), "registry", "serve",
            "--data-dir", str(tmp_path / "data"), "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    async with process_logged(argv, env, tmp_path / "registry.log") as registry, \
            httpx.AsyncClient(base_url=url, timeout=5) as client:
        await eventually(lambda: ready(client), timeout_s=120, what="the registry ready")
        async with half_requests(url, HALF_HEAD, flood) as statuses:
            # Some hang until the header timeout (408); the rest are refused by the cap,
            # which start-up lowered below the descriptor limit: accept never fails.
            assert set(statuses) <= {b"408", b"503", b"reset"}, set(statuses)
            assert statuses.count(b"408") > 0 and statuses.count(b"503") > 0
            assert registry.returncode is None
            await eventually(lambda: ready(client), timeout_s=30,
                             what="the same registry ready again")
