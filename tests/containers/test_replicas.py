"""Two registry containers on one Postgres: each outbox row reaches NATS exactly once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from devharness.adapters import make_adapter
from devharness.containers import ContainerStack
from devharness.uploads import adapter_parts, stream_events
from devharness.waiting import eventually
from tests.containers.conftest import registry_ready
from tests.containers.test_registry_stack import HEADERS, create_adapter

VERSIONS = 6


@pytest.fixture
async def second_registry(stack: ContainerStack) -> AsyncIterator[str]:
    replica = (stack.loraplane_container("registry", "serve", "--host", "0.0.0.0")
               .with_exposed_ports(8080).start())
    try:
        url = stack.url(replica, 8080)
        await eventually(lambda: registry_ready(url), timeout_s=120,
                         what="the second registry container answers /readyz with 200")
        yield url
    finally:
        replica.stop()


async def test_two_replicas_publish_each_outbox_row_exactly_once(
        stack: ContainerStack, second_registry: str, tmp_path: Path) -> None:
    await create_adapter(stack, "replicated")
    urls = [stack.registry_url, second_registry]

    async def push(number: int) -> None:
        folder = make_adapter(tmp_path / f"v{number}", seed=100 + number)
        async with httpx.AsyncClient(base_url=urls[number % 2], headers=HEADERS,
                                     timeout=120) as client:
            response = await client.post("/v1/adapters/replicated/versions",
                                         files=adapter_parts(folder), data={"aliases": "live"})
        assert response.status_code == 201, response.text

    await asyncio.gather(*(push(n) for n in range(VERSIONS)))

    async def all_published() -> list[dict[str, object]] | None:
        events = await stream_events(stack.nats_url)
        mine = [e for e in events if e.get("adapter") == "replicated"
                and e.get("type") == "version_published"]
        return events if len(mine) >= VERSIONS else None

    events = await eventually(all_published, timeout_s=90,
                              what=f"{VERSIONS} version_published events of replicated")
    ids = Counter(str(e["event_id"]) for e in events)
    assert [i for i, n in ids.items() if n > 1] == []
    versions = sorted(int(e["target"]["version"])  # type: ignore[index]
                      for e in events if e.get("adapter") == "replicated"
                      and e.get("type") == "version_published")
    assert versions == list(range(1, VERSIONS + 1))
