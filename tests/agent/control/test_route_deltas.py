"""``route_changed`` events applied in place by their revision, and the full read on a
gap: a real registry served over HTTP publishes the events to a real NATS, the agent's
reconciler reads them from JetStream and reads the registry through ``RegistryLink``;
only the swap and cache are fakes (tests/agent/loop_support.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from devharness.adapters import make_adapter
from devharness.http_registry import Served, serve_http
from devharness.services import NatsService
from devharness.uploads import upload_dir
from devharness.waiting import eventually
from inference_agent.control.reconciler import Reconciler
from inference_agent.control.workqueue import Done, WorkQueue
from inference_agent.metrics import AgentMetrics
from inference_agent.node.registry_client import RegistryLink
from inference_agent.serving.routes import RouteTable
from loraplane.events import STREAM_NAME, DesiredState, RouteChanged, parse_event
from tests.agent.loop_support import FakeCache, FakeSwapper

BASE = "tiny-llama"


@pytest.fixture
def backend() -> str:
    return "embedded"


@pytest.fixture
async def served(backend: str, tmp_path: Path, nats: NatsService) -> AsyncIterator[Served]:
    async with serve_http(backend, tmp_path / "data", nats) as served:
        yield served


class CountedReads:
    """The registry link, counting desired-state reads."""

    def __init__(self, link: RegistryLink) -> None:
        self.link = link
        self.reads = 0

    async def desired(self, base_model: str, adapter: str | None = None) -> DesiredState:
        self.reads += 1
        return await self.link.desired(base_model, adapter)


class Agent:
    def __init__(self, registry: CountedReads) -> None:
        self.routes = RouteTable(BASE)
        self.queue: WorkQueue[str] = WorkQueue()
        self.reconciler = Reconciler(
            base_model=BASE, registry=registry, routes=self.routes,
            swapper=FakeSwapper(self.routes), cache=FakeCache(), queue=self.queue,
            metrics=AgentMetrics(), max_attempts=3)

    async def drain(self) -> None:
        while len(self.queue):
            key = await self.queue.get()
            assert key is not None
            assert isinstance(await self.reconciler.reconcile(key), Done)
            self.queue.done(key)

    def rules(self) -> set[tuple[str, str, str]]:
        return {(r.kind, r.key, r.adapter) for r in self.routes.rules()}


async def route_events(nats_url: str, count: int) -> list[RouteChanged]:
    """The first ``count`` route events in the stream, once the relay published them."""
    connection = await nats.connect(nats_url)
    js = connection.jetstream()
    found: list[RouteChanged] = []

    async def published() -> bool:
        found.clear()
        last = (await js.stream_info(STREAM_NAME)).state.last_seq
        for seq in range(1, last + 1):
            event = parse_event((await js.get_msg(STREAM_NAME, seq)).data or b"")
            if isinstance(event, RouteChanged):
                found.append(event)
        return len(found) >= count

    try:
        await eventually(published, timeout_s=30, what=f"{count} route events published")
    finally:
        await connection.close()
    return found[:count]


async def put(served: Served, kind: str, key: str, adapter: str) -> None:
    response = await served.harness.client.put(
        f"/v1/routes/{kind}/{key}", json={"adapter": adapter},
        headers=served.harness.admin_headers)
    assert response.status_code == 200, response.text


async def test_route_changes_apply_in_place_and_a_gap_reads_them_all(
    served: Served, nats: NatsService, tmp_path: Path,
) -> None:
    for name in ("bot", "sum"):
        await served.harness.create_adapter(name)
        response = await upload_dir(served.harness, name,
                                    make_adapter(tmp_path / name, seed=3), aliases="live")
        assert response.status_code == 201, response.text
    token = (await served.harness.token("agent"))["Authorization"].removeprefix("Bearer ")
    registry = CountedReads(RegistryLink(served.url, token))
    agent = Agent(registry)
    try:
        snapshot = await agent.reconciler.resync_all()
        assert snapshot.route_revisions == {"acme": 0}
        await agent.drain()
        reads = registry.reads
        await put(served, "customer", "c1", "bot")
        await put(served, "task", "t", "sum")
        await put(served, "customer", "c1", "sum")  # a replacement
        response = await served.harness.client.delete(
            "/v1/routes/task/t", headers=served.harness.admin_headers)
        assert response.status_code == 204, response.text
        await put(served, "customer", "c2", "bot")
        # The relay keeps seq order within a batch only (registry_service/events/relay.py):
        # a row a polling pass claimed can go out after a later one handed over at its
        # commit (CI saw 1, 3, 2, 4, 5). The agent is fed them below in the order meant.
        events = sorted(await route_events(served.harness.nats.url, 5),
                        key=lambda e: e.route_revision or 0)
        assert [e.route_revision for e in events] == [1, 2, 3, 4, 5]
        # In order: each applied from the event alone.
        for event in events[:3]:
            agent.reconciler.on_event(event)
        await agent.drain()
        assert agent.rules() == {("customer", "c1", "sum"), ("task", "t", "sum")}
        # A duplicate changes nothing, and reads nothing.
        agent.reconciler.on_event(events[1])
        await agent.drain()
        assert registry.reads == reads
        assert agent.rules() == {("customer", "c1", "sum"), ("task", "t", "sum")}
        # Revision 4 lost: 5 is a gap, and the rules are read in full.
        agent.reconciler.on_event(events[4])
        await agent.drain()
        assert registry.reads == reads + 1
        assert agent.rules() == {("customer", "c1", "sum"), ("customer", "c2", "bot")}
        # The lost one arriving late is older than what was read: nothing changes.
        agent.reconciler.on_event(events[3])
        await agent.drain()
        assert registry.reads == reads + 1
        assert agent.rules() == {("customer", "c1", "sum"), ("customer", "c2", "bot")}
        counts = agent.reconciler.route_sync.counts
        assert (counts.applied, counts.ignored, counts.reads) == (3, 2, 1)
    finally:
        await registry.link.aclose()


async def test_an_older_snapshot_never_undoes_a_newer_change(
    served: Served, nats: NatsService, tmp_path: Path,
) -> None:
    await served.harness.create_adapter("bot")
    response = await upload_dir(served.harness, "bot", make_adapter(tmp_path / "bot", seed=3),
                                aliases="live")
    assert response.status_code == 201, response.text
    token = (await served.harness.token("agent"))["Authorization"].removeprefix("Bearer ")
    registry = CountedReads(RegistryLink(served.url, token))
    agent = Agent(registry)
    try:
        since = agent.reconciler.route_sync.mark()
        old = await registry.desired(BASE)  # read before the change, taken after it
        await agent.reconciler.resync_all()
        await put(served, "customer", "c1", "bot")
        (event,) = await route_events(served.harness.nats.url, 1)
        agent.reconciler.on_event(event)
        assert agent.rules() == {("customer", "c1", "bot")}
        agent.reconciler.route_sync.take(old, since)
        assert agent.rules() == {("customer", "c1", "bot")}
        # A snapshot as new as the change takes over.
        since = agent.reconciler.route_sync.mark()
        agent.reconciler.route_sync.take(await registry.desired(BASE), since)
        assert agent.rules() == {("customer", "c1", "bot")}
    finally:
        await registry.link.aclose()
