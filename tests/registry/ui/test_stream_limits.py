"""``/ui/api/stream`` costs: streams per token are capped, and one read per tick serves
every open stream (each cut to its own tenant). Over real HTTP (uvicorn)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
from sqlalchemy import event

from devharness.http_registry import Served, serve_http
from devharness.services import NatsService
from devharness.waiting import eventually
from registry_service.ui.stream import StreamHub
from tests.registry.auth.principals import assert_error
from tests.registry.ui.sse import Frames, live
from tests.registry.ui.support import OTHER, OWN, scene


@pytest.fixture
async def http_registry(tmp_path: Path, nats: NatsService) -> AsyncIterator[Served]:
    async with serve_http("embedded", tmp_path / "data", nats) as server:
        yield server


def hub(server: Served) -> StreamHub:
    found = server.harness.ctx.ui_streams
    assert found is not None
    return found


async def test_streams_per_token_are_capped(http_registry: Served) -> None:
    registry = http_registry.harness
    registry.settings.ui_max_streams_per_token = 2
    reader = await registry.token("reader", OWN)
    async with AsyncExitStack() as stack:
        # Each kept: a ``Frames`` dropped closes its stream (its reader is collected).
        opened = [await stack.enter_async_context(live(http_registry.url, reader))
                  for _ in range(2)]
        for frames in opened:
            await frames.next("changes")
        assert hub(http_registry).open_streams == 2
        async with httpx.AsyncClient(base_url=http_registry.url, timeout=30) as client:
            refused = await client.get("/ui/api/stream", headers=reader)
            assert_error(refused, 429, "too_many_streams")
            assert refused.headers.get("Retry-After")
            assert refused.json()["error"]["detail"] == {"max_streams_per_token": 2}
        # Another token has streams of its own.
        other = await stack.enter_async_context(
            live(http_registry.url, await registry.token("reader", OWN)))
        await other.next("changes")
    # Closed streams give their slots back.
    await eventually(lambda: hub(http_registry).open_streams == 0 or None,
                     what="the streams closed")
    async with live(http_registry.url, reader) as frames:
        await frames.next("changes")


async def test_one_read_per_tick_serves_every_stream(http_registry: Served,
                                                     tmp_path: Path) -> None:
    registry = http_registry.harness
    await scene(registry, tmp_path)
    own, other = await registry.token("reader", OWN), await registry.token("reader", OTHER)
    reads: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if "FROM agents" in statement:
            reads.append(statement)

    async with AsyncExitStack() as stack:
        streams: list[tuple[str, Frames]] = []
        for tenant, headers in ((OWN, own), (OWN, own), (OWN, own), (OTHER, other),
                                (OTHER, other), ("global", registry.admin_headers)):
            streams.append((tenant, await stack.enter_async_context(
                live(http_registry.url, headers))))
        # Each stream sees its own tenant's fleet only, from the shared read.
        expected = {OWN: ["bot"], OTHER: ["rival"], "global": ["bot", "rival"]}
        for tenant, frames in streams:
            _, fleet = await frames.next("fleet")
            assert [r["adapter"] for r in fleet["adapters"]] == expected[tenant]
        engine = registry.ctx.db.engine.sync_engine
        event.listen(engine, "before_cursor_execute", seen)
        try:
            start = hub(http_registry).ticks
            await eventually(lambda: hub(http_registry).ticks >= start + 3 or None,
                             what="three looks")
            ticks = hub(http_registry).ticks - start
        finally:
            event.remove(engine, "before_cursor_execute", seen)
    # One read of the agents per look, not one per stream per look (6 streams).
    assert len(reads) <= ticks + 1, (ticks, len(reads))
