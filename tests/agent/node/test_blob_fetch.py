"""Files fetched straight from S3 with the presigned URLs the relay adds to events, and
the fallback to the registry when a URL is refused, expired or unreachable.

A real registry (Postgres, SeaweedFS, NATS) served over HTTP publishes the events; the
test reads the published message from JetStream as an agent would.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiohttp
import httpx
import nats
import pytest

from devharness.adapters import make_adapter
from devharness.http_registry import Served, serve_http
from devharness.services import NatsService
from devharness.uploads import upload_dir
from devharness.waiting import eventually
from inference_agent.node.blob_fetch import BlobFetcher, DirectFetchFailed, masked
from inference_agent.node.registry_client import RegistryLink
from loraplane.events import STREAM_NAME, AdapterUpdated, FileRef, parse_event, subject_for


@pytest.fixture
def backend() -> str:
    return "postgres_s3"  # the local blob store signs no URL


@pytest.fixture
async def served(request: pytest.FixtureRequest, backend: str, tmp_path: Path,
                 nats: NatsService, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    # The tests' NATS takes no credentials, so "auto" would add no URLs.
    monkeypatch.setenv("LORAPLANE_EVENT_FILE_URLS", "on")
    pg, s3 = request.getfixturevalue("postgres"), request.getfixturevalue("seaweed")
    async with serve_http(backend, tmp_path / "data", nats, pg, s3) as served:
        yield served


async def published_move(served: Served, nats_url: str, tmp_path: Path) -> AdapterUpdated:
    """Publish ``bot`` v1 with ``live``; the alias move as JetStream holds it."""
    await served.harness.create_adapter("bot")
    folder = make_adapter(tmp_path / "src", seed=7)
    response = await upload_dir(served.harness, "bot", folder, aliases="live")
    assert response.status_code == 201, response.text
    connection = await nats.connect(nats_url)
    js = connection.jetstream()
    subject = subject_for("acme", "bot")
    found: list[AdapterUpdated] = []

    async def moved() -> bool:
        try:
            msg = await js.get_last_msg(STREAM_NAME, subject)
        except nats.js.errors.NotFoundError:
            return False
        event = parse_event(msg.data or b"")
        if isinstance(event, AdapterUpdated):
            found.append(event)
        return bool(found)

    try:
        await eventually(moved, timeout_s=30, what="the alias move published")
    finally:
        await connection.close()
    return found[-1]


async def agent_link(served: Served) -> RegistryLink:
    headers = await served.harness.token("agent")
    return RegistryLink(served.url, headers["Authorization"].removeprefix("Bearer "))


def requests_seen(link: RegistryLink) -> list[tuple[str, bool]]:
    """(url, had a bearer token) of every request ``link`` sends, to the registry or
    the store."""
    seen: list[tuple[str, bool]] = []

    async def started(_session: aiohttp.ClientSession, _context: object,
                      params: aiohttp.TraceRequestStartParams) -> None:
        seen.append((str(params.url), "authorization" in params.headers))

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(started)
    link.http.trace_configs.append(trace)
    link.blobs.trace_configs.append(trace)
    return seen


def with_url(file: FileRef, url: str | None) -> FileRef:
    """``file`` as an event would give it with ``url`` and without its bytes."""
    return file.model_copy(update={"direct_url": url, "content": None})


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_files_come_straight_from_s3(served: Served, nats: NatsService,
                                           tmp_path: Path) -> None:
    move = await published_move(served, nats.url, tmp_path)
    assert move.target is not None
    files = move.target.files
    assert all(f.direct_url and "X-Amz-Signature" in f.direct_url for f in files)
    # Neither the stored event nor any dump of it holds a URL: only the message does.
    listed = await served.harness.client.get("/v1/events",
                                             headers=served.harness.admin_headers)
    assert listed.status_code == 200 and "X-Amz" not in listed.text
    assert "X-Amz" not in move.model_dump_json() and "X-Amz" not in repr(move)
    # The config (under a KiB) travels in the message; the weights (68 KB) do not.
    inline = [f.name for f in files if f.content is not None]
    assert inline == ["adapter_config.json"]
    assert "content" not in move.model_dump_json() and "content" not in repr(move)
    link = await agent_link(served)
    seen = requests_seen(link)
    counted: list[tuple[str, str]] = []
    fetch = link.fetcher(on_fetch=lambda source, result: counted.append((source, result)))
    try:
        for file in files:
            await fetch(file, tmp_path / file.name)
            assert sha(tmp_path / file.name) == file.sha256
    finally:
        await link.aclose()
    assert sorted(counted) == [("direct", "ok"), ("inline", "ok")]
    # One request, straight to S3 with no token; none to the registry.
    assert [u for u, _ in seen if u.startswith(served.url)] == []
    assert len(seen) == 1 and not any(token for _, token in seen)


async def test_bytes_in_the_event_that_do_not_match_are_fetched_instead(
        served: Served, nats: NatsService, tmp_path: Path) -> None:
    move = await published_move(served, nats.url, tmp_path)
    assert move.target is not None
    config = next(f for f in move.target.files if f.content is not None)
    assert config.content is not None
    link = await agent_link(served)
    seen = requests_seen(link)
    counted: list[tuple[str, str]] = []
    fetch = link.fetcher(on_fetch=lambda source, result: counted.append((source, result)))
    wrong = [config.content[:-1] + b" ", config.content + b" ", b""]
    try:
        for content in wrong:
            dest = tmp_path / f"got-{len(counted)}"
            await fetch(config.model_copy(update={"content": content}), dest)
            assert sha(dest) == config.sha256
    finally:
        await link.aclose()
    assert counted == [("inline", "mismatch"), ("direct", "ok")] * len(wrong)
    assert len(seen) == len(wrong)


async def test_a_refused_or_unreachable_url_falls_back_to_the_registry(
    served: Served, nats: NatsService, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    move = await published_move(served, nats.url, tmp_path)
    assert move.target is not None
    file = move.target.files[0]
    assert file.direct_url is not None
    parts = urlsplit(file.direct_url)
    query = [(k, "0" * len(v) if k == "X-Amz-Signature" else v)
             for k, v in parse_qsl(parts.query)]
    forged = urlunsplit(parts._replace(query=urlencode(query)))
    closed = "http://127.0.0.1:9/bucket/blob?X-Amz-Signature=secret"
    link = await agent_link(served)
    seen = requests_seen(link)
    counted: list[tuple[str, str]] = []
    fetch = link.fetcher(on_fetch=lambda source, result: counted.append((source, result)))
    # DEBUG: nothing the agent logs at any level shows a signature.
    caplog.set_level(logging.DEBUG)
    try:
        for url in (forged, closed, None):
            dest = tmp_path / f"got-{len(counted)}"
            await fetch(with_url(file, url), dest)
            assert sha(dest) == file.sha256
    finally:
        await link.aclose()
    assert counted == [("direct", "status_403"), ("registry", "ok"),
                       ("direct", "unreachable"), ("registry", "ok"), ("registry", "ok")]
    registry_hops = [u for u, token in seen if u.startswith(served.url) and token]
    assert len(registry_hops) == 3
    # The signatures never reached a log line.
    assert "X-Amz-Signature" not in caplog.text and "secret" not in caplog.text


async def test_an_expired_url_is_refused_and_falls_back(served: Served, tmp_path: Path,
                                                        nats: NatsService) -> None:
    move = await published_move(served, nats.url, tmp_path)
    assert move.target is not None
    file = move.target.files[0]
    short = await served.harness.ctx.blobs.presigned_url(file.sha256, filename=file.name,
                                                         expires_s=1)
    assert short is not None

    async def expired() -> bool:
        async with httpx.AsyncClient() as client:
            return (await client.get(short)).status_code == 403

    await eventually(expired, timeout_s=30, what="the one-second URL expiring")
    link = await agent_link(served)
    counted: list[tuple[str, str]] = []
    fetch = link.fetcher(on_fetch=lambda source, result: counted.append((source, result)))
    try:
        await fetch(with_url(file, short), tmp_path / "late")
    finally:
        await link.aclose()
    assert counted == [("direct", "status_403"), ("registry", "ok")]
    assert sha(tmp_path / "late") == file.sha256


async def test_bytes_that_do_not_match_are_not_taken(served: Served, nats: NatsService,
                                                     tmp_path: Path) -> None:
    move = await published_move(served, nats.url, tmp_path)
    assert move.target is not None
    first, second = move.target.files
    fetcher = BlobFetcher()
    try:
        with pytest.raises(DirectFetchFailed) as info:
            # Another file's URL: S3 answers, but the bytes are not this file's.
            assert second.direct_url is not None
            await fetcher.download(second.direct_url, tmp_path / "x", size=first.size,
                                   sha256=first.sha256)
    finally:
        await fetcher.aclose()
    assert info.value.reason == "mismatch" and "X-Amz" not in str(info.value)


@pytest.mark.parametrize("url, shown", [
    ("http://s3:8333/b/k?X-Amz-Signature=abc", "http://s3:8333/b/k"),
    ("https://user:pw@host/b/k?sig=1", "https://host/b/k"),
])
def test_masked_keeps_no_credential(url: str, shown: str) -> None:
    assert masked(url) == shown
