"""Clients that never finish a request cannot take the agent down (issue 35, High 2).

A connection must send its whole request head within ``header_timeout_s`` or it is
closed; beyond ``max_connections`` a connection is answered 503 at once; and a periodic
task that fails with an ``OSError`` (EMFILE: no descriptor left) is logged and started
again instead of ending the agent's TaskGroup, and with it the agent. Loopback only,
with bounded numbers of connections.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import resource
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from devharness.services import NatsService
from devharness.vllm_standin import StandIn, create_app
from devharness.waiting import eventually
from inference_agent import tasks
from inference_agent.control.keys import ALL
from inference_agent.http_server import QuietServer, server_config
from inference_agent.service import Agent
from inference_agent.serving.front_door import FrontDoor
from inference_agent.serving.streams import Inflight
from inference_agent.settings import AgentSettings
from inference_agent.tasks import keep_running
from loraplane.http_guard import DESCRIPTOR_RESERVE, GuardedProtocol, bounded_by_descriptors
from loraplane.netutil import free_port
from tests.agent.loop_support import serve_app, served_registry
from tests.agent.test_service import keys_file
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

BASE = "tiny-llama"
HALF_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: agent\r\nContent-Le"


def settings_for(tmp_path: Path, **overrides: Any) -> AgentSettings:
    watch = tmp_path / "watch"
    watch.mkdir(exist_ok=True)
    return AgentSettings(base_model=BASE, watch_dir=watch, cache_dir=tmp_path / "cache",
                         keys_file=keys_file(tmp_path), vllm_url="http://127.0.0.1:9",
                         port=0, agent_id="gpu-1", **overrides)


async def _ok(_request: Request) -> Response:
    return PlainTextResponse("ok")


def front_door() -> FrontDoor:
    async def generate(_headers: Any, _body: bytes, _path: str) -> Response:
        return PlainTextResponse("generated")

    return FrontDoor(Starlette(routes=[Route("/healthz", _ok)]), generate, Inflight())


@asynccontextmanager
async def serving(settings: AgentSettings) -> AsyncIterator[tuple[str, QuietServer]]:
    """A front door under the agent's own server configuration, on a loopback port."""
    sock = loopback_socket()
    server = QuietServer(server_config(front_door(), settings))
    async with serving_on(server, sock) as url:
        yield url, server


async def test_half_sent_requests_are_closed_after_the_header_timeout(
        tmp_path: Path) -> None:
    async with serving(settings_for(tmp_path, header_timeout_s=0.5)) as (url, server):
        connections = [await connect(url) for _ in range(60)]
        for index, (_reader, writer) in enumerate(connections):
            if index % 2 == 0:  # half a request head; the others send nothing at all
                writer.write(HALF_HEAD)
                await writer.drain()
        async with httpx.AsyncClient(base_url=url) as client:
            # A whole request is served while they hang.
            assert (await client.get("/healthz")).text == "ok"
            # Each is closed by the server, not by this test: read() returns at EOF.
            answers = await asyncio.wait_for(
                asyncio.gather(*(reader.read() for reader, _ in connections)), 30)
            for index, answer in enumerate(answers):
                if index % 2 == 0:
                    head, _, body = answer.partition(b"\r\n\r\n")
                    assert head.startswith(b"HTTP/1.1 408 "), answer
                    assert b"connection: close" in head
                    assert json.loads(body)["error"]["code"] == "header_timeout"
                else:
                    assert answer == b""
            for _reader, writer in connections:
                writer.close()
            # Only the client's own kept-alive connection is left, and between requests
            # it is the keep-alive timeout's, not the header timeout's.
            await eventually(lambda: len(server.server_state.connections) == 1,
                             timeout_s=10, what="the hung connections gone")
            assert (await client.get("/healthz")).text == "ok"
            kept = next(iter(server.server_state.connections))
            assert isinstance(kept, GuardedProtocol) and kept._header_timer is None


async def test_a_connection_beyond_the_cap_is_answered_503_at_once(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, header_timeout_s=60, max_connections=8)
    async with serving(settings) as (url, server):
        held = [await connect(url) for _ in range(8)]
        await eventually(lambda: len(server.server_state.connections) == 8, timeout_s=10,
                         what="eight connections accepted")
        # Answered without a byte sent: the cap does not wait for a request head. And
        # one that sends its request anyway still reads the answer (no reset).
        for request in (b"", b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n"):
            reader, writer = await connect(url)
            writer.write(request)
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503 "), answer
            assert b"retry-after: 1" in head.lower()
            assert json.loads(body)["error"]["code"] == "too_many_connections"
        for _reader, held_writer in held[:4]:
            held_writer.close()
        await eventually(lambda: len(server.server_state.connections) == 4, timeout_s=10,
                         what="four connections closed")
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/healthz")).text == "ok"
        for _reader, held_writer in held[4:]:
            held_writer.close()


def test_the_cap_stays_below_the_descriptor_limit() -> None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert bounded_by_descriptors(soft * 2) == max(1, soft - DESCRIPTOR_RESERVE)
    assert bounded_by_descriptors(4) == 4


def test_bad_connection_settings_are_refused(tmp_path: Path) -> None:
    for bad in ({"header_timeout_s": 0}, {"header_timeout_s": float("nan")},
                {"max_connections": 0}):
        with pytest.raises(ValueError):
            settings_for(tmp_path, **bad)


# --- a periodic task failing with EMFILE ---------------------------------------------------


async def test_keep_running_starts_a_task_again_after_an_os_error() -> None:
    runs: list[int] = []

    async def flaky() -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise OSError(errno.EMFILE, "Too many open files")

    await asyncio.wait_for(keep_running("flaky", flaky, delay_s=0), 10)
    assert runs == [0, 1, 2]

    async def buggy() -> None:
        raise ValueError("a bug is not a passing state of the host")

    with pytest.raises(ValueError):
        await keep_running("buggy", buggy, delay_s=0)


@asynccontextmanager
async def agent_running(settings: AgentSettings) -> AsyncIterator[
        tuple[Agent, asyncio.Task[None]]]:
    agent = Agent(settings)
    run = asyncio.create_task(agent.run(install_signals=False))
    try:
        async with asyncio.timeout(120):
            waiting = asyncio.ensure_future(agent.ready.wait())
            await asyncio.wait({waiting, run}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
        assert agent.ready.is_set(), "the agent ended before it was ready"
        yield agent, run
    finally:
        agent.stop()
        await asyncio.wait_for(asyncio.gather(run, return_exceptions=True), 30)


async def test_emfile_in_the_status_report_and_the_resync_does_not_end_the_agent(
        tmp_path: Path, nats: NatsService, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "RESTART_DELAY_S", 0.01)
    async with served_registry(tmp_path, nats) as reg, \
            serve_app(create_app(StandIn(BASE))) as vllm_url:
        settings = AgentSettings(
            registry=reg.url, token=await reg.agent_token(), nats_url=None,
            vllm_url=vllm_url, base_model=BASE, agent_id="emfile", port=0,
            cache_dir=tmp_path / "cache", credentials_refresh_s=3600,
            resync_interval_s=0.05, heartbeat_interval_s=3600)
        async with agent_running(settings) as (agent, run):
            assert agent.status is not None
            failures = {"disk": 0, "resync": 0}
            listing = agent.materializer.on_disk
            mirror = agent.reconciler.mirror
            drop = mirror.drop

            def on_disk() -> Any:
                if failures["disk"] < 3:
                    failures["disk"] += 1
                    raise OSError(errno.EMFILE, "Too many open files", "cache")
                return listing()

            def resync(key: str) -> None:
                # The periodic resync drops ALL from the mirror as it queues it.
                if key == ALL and failures["resync"] < 3:
                    failures["resync"] += 1
                    raise OSError(errno.EMFILE, "Too many open files")
                drop(key)

            monkeypatch.setattr(agent.materializer, "on_disk", on_disk)
            monkeypatch.setattr(mirror, "drop", resync)
            agent.status.retry_s = 0.01
            posted = agent.status.posted
            agent.status.changed()
            # Both tasks met EMFILE three times; the report went out once it passed.
            await eventually(lambda: failures == {"disk": 3, "resync": 3}
                             and agent.status is not None
                             and agent.status.posted > posted,
                             timeout_s=30, what=f"EMFILE met and passed ({failures}, "
                             f"{agent.status.posted} posted)")
            assert not run.done()
            assert agent.url is not None
            async with httpx.AsyncClient(base_url=agent.url) as client:
                assert (await client.get("/healthz")).status_code == 200


# --- out of descriptors, in a process of its own -------------------------------------------


async def test_an_agent_with_few_descriptors_outlives_a_flood_of_half_requests(
        tmp_path: Path) -> None:
    flood = 400
    ensure_descriptors(flood + 100)
    watch = tmp_path / "watch"
    watch.mkdir()
    port = free_port()
    async with serve_app(create_app(StandIn(BASE))) as vllm_url:
        env = {**os.environ, "LORAPLANE_HEADER_TIMEOUT_S": "2",
               "LORAPLANE_MAX_CONNECTIONS": "100000"}
        argv = [*few_descriptors("inference_agent"), "--base-model", BASE,
                "--watch-dir", str(watch), "--keys-file", str(keys_file(tmp_path)),
                "--cache-dir", str(tmp_path / "cache"), "--vllm-url", vllm_url,
                "--port", str(port), "--agent-id", "few-fds"]
        url = f"http://127.0.0.1:{port}"
        async with process_logged(argv, env, tmp_path / "agent.log") as agent, \
                httpx.AsyncClient(base_url=url, timeout=5) as client:
            await eventually(lambda: ready(client), timeout_s=120, what="the agent ready")
            async with half_requests(url, HALF_HEAD, flood) as statuses:
                # The first 128 (256 descriptors less the reserve) hang until the
                # header timeout; the rest are refused at once by the cap (503, or reset
                # once too many refused ones linger): none makes accept fail.
                assert set(statuses) <= {b"408", b"503", b"reset"}, set(statuses)
                assert 0 < statuses.count(b"408") <= 256 - DESCRIPTOR_RESERVE
                assert statuses.count(b"503") > 0
                # The same process serves again: no restart.
                assert agent.returncode is None
                assert (await client.get("/healthz")).status_code == 200
                assert await ready(client)
