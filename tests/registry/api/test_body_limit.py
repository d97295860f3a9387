"""Every JSON body has a size limit, enforced before the body is read, let alone parsed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devharness.adapters import make_adapter
from devharness.http_registry import serve_http
from devharness.registry import RegistryHarness
from devharness.services import NatsService
from devharness.uploads import adapter_parts, upload

HUGE = 150 * 1024 * 1024
CHUNK = 64 * 1024


async def _raw_post(url: str, head: dict[str, str], first_bytes: bytes) -> tuple[int, Any]:
    """Send a request's head and the start of its body, then read the answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        lines = ["POST /v1/adapters HTTP/1.1", f"Host: {host}",
                 *(f"{k}: {v}" for k, v in head.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + first_bytes)
        await writer.drain()
        # The rest of the 150 MiB is never sent: the answer must come without it.
        raw = await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split()[1]), json.loads(body)


@pytest.mark.parametrize("authenticated", [False, True])
async def test_an_oversized_content_length_is_refused_before_the_body_is_sent(
    tmp_path: Path, nats: NatsService, authenticated: bool
) -> None:
    async with serve_http("embedded", tmp_path / "data", nats) as served:
        head = {"Content-Type": "application/json", "Content-Length": str(HUGE)}
        if authenticated:
            head["Authorization"] = f"Bearer {served.admin_token}"
        status, body = await _raw_post(served.url, head, b'{"name": "')
    assert status == 413
    assert body["error"]["code"] == "body_too_large"
    assert body["error"]["detail"] == {"limit": 1024 * 1024}


class _Body:
    """A chunked body of ``total`` bytes, produced only as the server asks for it."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.sent = 0

    async def chunks(self) -> AsyncIterator[bytes]:
        yield b'{"name": "'
        while self.sent < self.total:
            self.sent += CHUNK
            yield b"x" * CHUNK


@pytest.mark.parametrize("authenticated", [False, True])
async def test_a_chunked_body_is_cut_off_at_the_limit(
    embedded_registry: RegistryHarness, authenticated: bool
) -> None:
    registry = embedded_registry
    body = _Body(HUGE)
    headers = {"Content-Type": "application/json"}
    if authenticated:
        headers.update(registry.admin_headers)
    response = await registry.client.post("/v1/adapters", content=body.chunks(),
                                          headers=headers)
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "body_too_large"
    limit = registry.settings.max_json_body_bytes
    # Read up to the limit and one chunk more, not the 150 MiB.
    assert body.sent <= limit + CHUNK
    assert response.headers["connection"] == "close"


async def test_the_limit_is_a_setting_and_bodies_under_it_pass(
    embedded_registry: RegistryHarness
) -> None:
    registry = embedded_registry
    registry.ctx.settings.max_json_body_bytes = 2048
    adapter = {"name": "bot", "base_model": "tiny-llama", "tenant": "acme"}
    over = await registry.client.post("/v1/adapters", headers=registry.admin_headers,
                                      json={**adapter, "description": "d" * 4096})
    assert over.status_code == 413 and over.json()["error"]["code"] == "body_too_large"
    under = await registry.client.post("/v1/adapters", headers=registry.admin_headers,
                                       json=adapter)
    assert under.status_code == 201, under.text


async def test_uploads_keep_their_own_limits(
    embedded_registry: RegistryHarness, tmp_path: Path
) -> None:
    registry = embedded_registry
    await registry.create_adapter("bot")
    registry.ctx.settings.max_json_body_bytes = 1024
    folder = make_adapter(tmp_path / "a", hidden=256)
    assert sum(len(data) for _, (_, data) in adapter_parts(folder)) > 1024
    response = await upload(registry, "bot", adapter_parts(folder))
    assert response.status_code == 201, response.text
