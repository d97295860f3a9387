"""Each token has a limited number of uploads in flight; a slot is freed on every outcome."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from devharness.adapters import make_adapter
from devharness.http_registry import serve_http
from devharness.registry import RegistryHarness
from devharness.services import NatsService
from devharness.uploads import adapter_parts, count_rows, upload
from devharness.waiting import eventually

Parts = list[tuple[str, tuple[str, bytes]]]


def _encode(parts: Parts) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://registry/", files=parts)
    return request.read(), request.headers["content-type"]


class _HeldUpload:
    """An upload whose body stops after its first bytes until ``release`` is set."""

    def __init__(self, parts: Parts) -> None:
        self.body, self.content_type = _encode(parts)
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self.body[:1024]
        self.started.set()
        await self.release.wait()
        yield self.body[1024:]

    def send(self, registry: RegistryHarness, adapter: str,
             headers: dict[str, str]) -> asyncio.Task[httpx.Response]:
        return asyncio.create_task(registry.client.post(
            f"/v1/adapters/{adapter}/versions", content=self.chunks(),
            headers={**headers, "Content-Type": self.content_type}, timeout=120))


async def test_uploads_past_the_limit_get_429_while_the_others_proceed(
    embedded_registry: RegistryHarness, tmp_path: Path
) -> None:
    registry = embedded_registry
    registry.ctx.settings.max_uploads_per_token = 2
    for name in ("bot0", "bot1", "bot2"):
        await registry.create_adapter(name)
    held = [_HeldUpload(adapter_parts(make_adapter(tmp_path / f"a{i}", seed=i)))
            for i in range(2)]
    tasks = [h.send(registry, f"bot{i}", registry.admin_headers) for i, h in enumerate(held)]
    for h in held:
        await asyncio.wait_for(h.started.wait(), timeout=30)
    assert registry.ctx.upload_slots.in_flight() == 2

    third = adapter_parts(make_adapter(tmp_path / "a2", seed=2))
    refused = await upload(registry, "bot2", third)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "too_many_uploads"
    assert refused.json()["error"]["detail"] == {"in_flight": 2, "limit": 2}
    assert int(refused.headers["Retry-After"]) > 0
    # Nothing of it was staged: the two folders there are the held uploads'.
    assert len(list(registry.settings.staging_dir.iterdir())) == 2
    # Another token has slots of its own.
    other = await registry.token("publisher", "acme")
    assert (await upload(registry, "bot2", third, headers=other)).status_code == 201

    for h in held:
        h.release.set()
    assert [(await t).status_code for t in tasks] == [201, 201]
    assert registry.ctx.upload_slots.in_flight() == 0
    again = adapter_parts(make_adapter(tmp_path / "a3", seed=3))
    assert (await upload(registry, "bot2", again)).status_code == 201
    assert (await count_rows(registry))[0] == 4


async def test_a_refused_upload_frees_its_slot(
    embedded_registry: RegistryHarness, tmp_path: Path
) -> None:
    registry = embedded_registry
    registry.ctx.settings.max_uploads_per_token = 1
    await registry.create_adapter("bot")
    bad = adapter_parts(make_adapter(tmp_path / "bad", seed=1))[:1]  # no weights
    for _ in range(3):
        response = await upload(registry, "bot", bad)
        assert response.json()["error"]["code"] == "missing_weights"
    good = adapter_parts(make_adapter(tmp_path / "good", seed=2))
    assert (await upload(registry, "bot", good)).status_code == 201


async def test_a_client_that_goes_away_frees_its_slot(
    tmp_path: Path, nats: NatsService
) -> None:
    async with serve_http("embedded", tmp_path / "data", nats) as served:
        registry = served.harness
        await registry.create_adapter("bot")
        body, content_type = _encode(adapter_parts(make_adapter(tmp_path / "a", seed=1)))
        host, port = served.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        head = (f"POST /v1/adapters/bot/versions HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {served.admin_token}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n")
        writer.write(head.encode() + body[:1024])
        await writer.drain()
        slots = registry.ctx.upload_slots
        await eventually(lambda: slots.in_flight() == 1, what="the upload holds a slot")
        writer.close()  # the client goes away mid-body
        await eventually(lambda: slots.in_flight() == 0, what="the slot is freed")
        await eventually(lambda: not any(registry.settings.staging_dir.iterdir()),
                         what="the staging folder is removed")
        assert await count_rows(registry) == (0, 1)  # adapter_created only
        del reader
