"""The desired-state snapshot carries presigned URLs when events do, so a starting
agent fetches straight from S3: no file request reaches the registry. With the URLs
turned off the same agent fetches through the registry (its 307), as before.

A real registry (Postgres, SeaweedFS, NATS) over HTTP, a real agent in this loop, and
the vLLM stand-in (devharness/vllm_standin.py) in place of vLLM.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devharness.adapters import make_adapter
from devharness.http_registry import Served, serve_http
from devharness.services import NatsService
from devharness.uploads import upload_dir
from devharness.vllm_standin import StandIn, create_app
from devharness.waiting import eventually
from inference_agent.node.blob_fetch import BlobFetcher
from inference_agent.settings import AgentSettings
from loraplane.events import DesiredState
from tests.agent.loop_support import running_agent, serve_app

BASE = "tiny-llama"
FETCHES = "loraplane_agent_file_fetches_total"


@pytest.fixture(params=["on", "off"])
def file_urls(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def served(request: pytest.FixtureRequest, file_urls: str, tmp_path: Path,
                 nats: NatsService, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    # The tests' NATS takes no credentials, so "auto" would add no URLs.
    monkeypatch.setenv("LORAPLANE_EVENT_FILE_URLS", file_urls)
    pg, s3 = request.getfixturevalue("postgres"), request.getfixturevalue("seaweed")
    async with serve_http("postgres_s3", tmp_path / "data", nats, pg, s3) as served:
        yield served


async def publish(served: Served, tmp_path: Path, *names: str) -> None:
    for seed, name in enumerate(names):
        await served.harness.create_adapter(name)
        response = await upload_dir(served.harness, name, make_adapter(tmp_path / name,
                                                                       seed=seed),
                                    aliases="live")
        assert response.status_code == 201, response.text


async def agent_token(served: Served) -> str:
    return (await served.harness.token("agent"))["Authorization"].removeprefix("Bearer ")


def files_of(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    return [file for adapter in snapshot["adapters"] for alias in adapter["aliases"]
            for file in alias["target"]["files"]]


async def test_the_snapshot_carries_a_url_for_every_file(
        served: Served, file_urls: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    await publish(served, tmp_path, "bot", "other")
    caplog.set_level(logging.INFO)
    token = await agent_token(served)
    async with httpx.AsyncClient(base_url=served.url,
                                 headers={"Authorization": f"Bearer {token}"}) as client:
        full = await client.get("/v1/desired", params={"base_model": BASE})
        one = await client.get("/v1/desired", params={"base_model": BASE, "adapter": "bot"})
    assert full.status_code == one.status_code == 200, (full.text, one.text)
    files, only_bot = files_of(full.json()), files_of(one.json())
    assert len(files) == 4 and len(only_bot) == 2
    if file_urls == "off":
        assert not any("direct_url" in f for f in files + only_bot)
        return
    assert all("X-Amz-Signature" in f["direct_url"] for f in files + only_bot)
    fetcher = BlobFetcher()  # the URL alone is the credential
    try:
        for n, file in enumerate(files):
            await fetcher.download(file["direct_url"], tmp_path / f"got-{n}",
                                   size=file["size"], sha256=file["sha256"])
    finally:
        await fetcher.aclose()
    # The agent's model keeps the URLs but never dumps or prints them.
    state = DesiredState.model_validate(full.json())
    assert all(f.direct_url for a in state.adapters for al in a.aliases
               for f in al.target.files)
    assert "X-Amz" not in state.model_dump_json() and "X-Amz" not in repr(state)
    assert "X-Amz-Signature" not in caplog.text


async def test_a_starting_agent_fetches_no_file_through_the_registry(
        served: Served, file_urls: str, tmp_path: Path) -> None:
    # Published before the agent starts: it learns them from the snapshot alone. Neither
    # has a placement setting, so the agent fetches both versions as it starts.
    await publish(served, tmp_path, "bot", "other")
    async with serve_app(create_app(StandIn(BASE))) as vllm_url:
        settings = AgentSettings(
            registry=served.url, token=await agent_token(served), nats_url=None,
            vllm_url=vllm_url, base_model=BASE, agent_id="starting", port=0,
            cache_dir=tmp_path / "cache", credentials_refresh_s=3600)
        async with running_agent(settings) as agent:
            def fetched(source: str) -> float:
                value = agent.metrics.registry.get_sample_value(
                    FETCHES, {"source": source, "result": "ok"})
                return value or 0.0

            await eventually(lambda: fetched("direct") + fetched("registry") >= 4,
                             timeout_s=60, what="both versions' files fetched")
            on_disk = agent.materializer.on_disk()
    assert on_disk == {("bot", 1), ("other", 1)}
    if file_urls == "on":
        assert (fetched("direct"), fetched("registry")) == (4, 0)
    else:
        assert (fetched("direct"), fetched("registry")) == (0, 4)
