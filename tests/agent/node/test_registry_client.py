"""RegistryLink against a real registry served over HTTP, on both backends.

The registry app runs in uvicorn on a free port, so the client goes through real
sockets, and on the S3 backend through the registry's 307 to a presigned SeaweedFS URL.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from devharness.adapters import make_adapter
from devharness.http_registry import Served, serve_http
from devharness.services import NatsService
from devharness.uploads import upload_dir
from inference_agent.errors import (
    FetchFailed,
    NotServable,
    RegistryUnavailable,
    TerminalError,
)
from inference_agent.metrics import AgentMetrics
from inference_agent.node import registry_http
from inference_agent.node.materialize import Materializer
from inference_agent.node.registry_client import RegistryLink
from loraplane.events import AgentStatus, ServedVersion
from loraplane.netutil import free_port
from tests.agent.node.test_blob_fetch import requests_seen


@pytest.fixture
async def served(request: pytest.FixtureRequest, backend: str, tmp_path: Path,
                 nats: NatsService) -> AsyncIterator[Served]:
    pg = s3 = None
    if backend == "postgres_s3":
        pg, s3 = request.getfixturevalue("postgres"), request.getfixturevalue("seaweed")
    async with serve_http(backend, tmp_path / "data", nats, pg, s3) as served:
        yield served


async def agent_client(served: Served) -> RegistryLink:
    headers = await served.harness.token("agent")
    token = headers["Authorization"].removeprefix("Bearer ")
    return RegistryLink(served.url, token, timeout_s=30)


async def publish(served: Served, tmp_path: Path, name: str = "bot") -> Path:
    await served.harness.create_adapter(name)
    folder = make_adapter(tmp_path / f"src-{name}", seed=7)
    response = await upload_dir(served.harness, name, folder, aliases="live")
    assert response.status_code == 201, response.text
    return folder


async def test_desired_and_version(served: Served, tmp_path: Path) -> None:
    await publish(served, tmp_path, "bot")
    await publish(served, tmp_path, "other")
    response = await served.harness.client.put(
        "/v1/routes/customer/c1", json={"adapter": "bot"}, headers=served.harness.admin_headers)
    assert response.status_code == 200, response.text
    client = await agent_client(served)
    try:
        desired = await client.desired("tiny-llama")
        assert sorted(a.name for a in desired.adapters) == ["bot", "other"]
        assert [(r.kind, r.key, r.adapter) for r in desired.routes] == [("customer", "c1", "bot")]
        assert desired.stream_seq >= 0
        one = await client.desired("tiny-llama", adapter="bot")
        assert [a.name for a in one.adapters] == ["bot"]
        (live,) = one.adapters[0].aliases
        ref = await client.version("bot", 1)
        assert ref == live.target and ref.rank == 8 and len(ref.files) == 2
        with pytest.raises(NotServable):
            await client.version("bot", 99)
    finally:
        await client.aclose()


async def test_a_bad_token_is_terminal(served: Served) -> None:
    client = RegistryLink(served.url, "lp_not-a-token")
    try:
        with pytest.raises(TerminalError) as info:
            await client.desired("tiny-llama")
        assert not info.value.retryable and info.value.detail["status"] == 401
    finally:
        await client.aclose()


async def test_download_streams_and_never_sends_the_token_to_s3(served: Served,
                                                                tmp_path: Path) -> None:
    source = await publish(served, tmp_path)
    client = await agent_client(served)
    sent = requests_seen(client)
    try:
        ref = await client.version("bot", 1)
        weights = next(f for f in ref.files if f.name.endswith(".safetensors"))
        counted: list[int] = []
        dest = tmp_path / "weights"
        await client.download(weights.url, dest, size=weights.size, sha256=weights.sha256,
                              on_bytes=counted.append)
        assert hashing(dest) == hashing(source / weights.name) == weights.sha256
        assert sum(counted) == weights.size
        file_requests = [s for s in sent if "/files/" in s[0] or "X-Amz" in s[0]]
        if served.harness.backend == "postgres_s3":
            # The registry answered 307; the second request went to S3 without the token.
            (registry_hop, s3_hop) = file_requests
            assert registry_hop[0].startswith(served.url) and registry_hop[1]
            assert not s3_hop[0].startswith(served.url) and "X-Amz-Signature" in s3_hop[0]
            assert not s3_hop[1], "the bearer token was sent to S3"
        else:
            assert len(file_requests) == 1 and file_requests[0][1]
        with pytest.raises(FetchFailed, match="sha256"):
            await client.download(weights.url, tmp_path / "x", size=weights.size,
                                  sha256="0" * 64)
        with pytest.raises(FetchFailed, match="larger"):
            await client.download(weights.url, tmp_path / "y", size=weights.size - 1,
                                  sha256=weights.sha256)
        with pytest.raises(FetchFailed):
            await client.download(weights.url.replace("/1/", "/42/"), tmp_path / "z",
                                  size=1, sha256="0" * 64)
    finally:
        await client.aclose()


async def test_materializer_through_the_registry(served: Served, tmp_path: Path) -> None:
    await publish(served, tmp_path)
    client = await agent_client(served)
    metrics = AgentMetrics()
    try:
        mat = Materializer(tmp_path / "cache", max_bytes=10**9,
                           fetch=client.fetcher(metrics.bytes_downloaded.inc),
                           base_shapes=None, max_rank=16, metrics=metrics)
        ref = await client.version("bot", 1)
        folder = await mat.materialize(ref)
        assert sorted(p.name for p in folder.iterdir()) == sorted(f.name for f in ref.files)
        downloaded = metrics.registry.get_sample_value("loraplane_agent_downloaded_bytes_total")
        assert downloaded == sum(f.size for f in ref.files)
    finally:
        await client.aclose()


async def test_post_status_shows_in_the_fleet_view(served: Served, tmp_path: Path) -> None:
    await publish(served, tmp_path)
    client = await agent_client(served)
    status = AgentStatus(
        agent_id="gpu-1", base_model="tiny-llama", time=datetime.now(UTC),
        served=[ServedVersion(adapter="bot", alias="live", version=1, state="serving")],
        loaded=["bot@1"])
    try:
        await client.post_status(status)
    finally:
        await client.aclose()
    response = await served.harness.client.get("/v1/agents",
                                               headers=served.harness.admin_headers)
    assert response.status_code == 200, response.text
    assert "gpu-1" in response.text and "bot" in response.text


def hashing(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _status(agent_id: str = "gpu-1") -> AgentStatus:
    return AgentStatus(agent_id=agent_id, base_model="tiny-llama", time=datetime.now(UTC),
                       served=[], loaded=[])


async def test_a_refused_report_is_terminal_with_the_registrys_code(served: Served) -> None:
    # A refusal of a report reads as on the client's path.
    client = RegistryLink(served.url, "lp_not-a-token", timeout_s=30)
    try:
        with pytest.raises(TerminalError) as raised:
            await client.post_status(_status())
    finally:
        await client.aclose()
    assert raised.value.detail["status"] == 401
    assert raised.value.code.startswith("registry_")


async def test_a_report_to_a_registry_that_is_down_is_retried() -> None:
    port = free_port()  # nothing listens there
    client = RegistryLink(f"http://127.0.0.1:{port}", "lp_any", timeout_s=5)
    try:
        with pytest.raises(RegistryUnavailable) as raised:
            await client.post_status(_status())
    finally:
        await client.aclose()
    assert raised.value.detail["url"] == f"http://127.0.0.1:{port}"


async def test_an_answer_past_its_bound_is_not_read(
        served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    await publish(served, tmp_path)
    monkeypatch.setattr(registry_http, "MAX_ANSWER_BYTES", 100)
    client = await agent_client(served)
    try:
        with pytest.raises(RegistryUnavailable, match="larger than 100 bytes"):
            await client.desired("tiny-llama")
    finally:
        await client.aclose()
