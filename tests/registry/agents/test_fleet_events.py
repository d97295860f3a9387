"""Fleet membership as ``fleet_changed`` events: a join with the report that makes an
agent live, a graceful leave with its last report, a silent one seen by the watcher
after the staleness window (a setting now), and nothing for an ordinary report. On
each backend, through the app, its relay and a real NATS."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import select

from devharness.registry import RegistryHarness
from devharness.services import NatsService
from devharness.waiting import eventually
from loraplane.events import FLEET_TENANT, FleetChanged, parse_event, subject_for
from registry_service.agents.fleet import FleetWatcher, check_interval
from registry_service.events.models import EventRow
from registry_service.events.service import event_json
from registry_service.settings import RegistrySettings
from tests.conftest import _registry
from tests.registry.agents.support import BASE_MODEL, age_agent, fleet, post_status, report
from tests.registry.events.support import all_published

STALE_S = 20.0


@pytest.fixture
async def short_window(request: pytest.FixtureRequest, backend: str, tmp_path: Path,
                       nats: NatsService) -> AsyncIterator[RegistryHarness]:
    """A registry whose agents go stale after STALE_S seconds without a report."""
    async for harness in _registry(request, backend, tmp_path, nats,
                                   agent_stale_after_s=STALE_S):
        yield harness


async def fleet_events(registry: RegistryHarness) -> list[FleetChanged]:
    async with registry.ctx.db.session() as session:
        rows = await session.scalars(select(EventRow).where(EventRow.type == "fleet_changed")
                                     .order_by(EventRow.seq))
        events = [parse_event(json.dumps(event_json(row))) for row in rows]
    return [e for e in events if isinstance(e, FleetChanged)]


def summary(events: list[FleetChanged]) -> list[tuple[list[str], list[str], list[str]]]:
    return [(e.agents, e.joined, e.left) for e in events]


async def test_joins_and_graceful_leaves_are_events_ordinary_reports_are_not(
    short_window: RegistryHarness,
) -> None:
    registry = short_window
    for agent_id in ("gpu-a", "gpu-b", "gpu-a"):
        assert (await post_status(registry, report(agent_id))).status_code == 200
    assert summary(await fleet_events(registry)) == [
        (["gpu-a"], ["gpu-a"], []), (["gpu-a", "gpu-b"], ["gpu-b"], [])]
    leaving = {**report("gpu-a"), "leaving": True}
    answer = await post_status(registry, leaving)
    assert answer.status_code == 200 and answer.json()["stale"] is True
    events = await fleet_events(registry)
    assert summary(events)[2:] == [(["gpu-b"], [], ["gpu-a"])]
    assert events[-1].tenant == FLEET_TENANT and events[-1].base_model == BASE_MODEL
    shown = await fleet(registry)
    assert shown["gpu-a"]["stale"] and not shown["gpu-b"]["stale"]
    desired = await registry.client.get("/v1/desired", params={"base_model": BASE_MODEL},
                                        headers=registry.admin_headers)
    assert desired.json()["agents"] == ["gpu-b"]
    # Said twice (a retried request), the leave is recorded once; back again, a join.
    await post_status(registry, leaving)
    await post_status(registry, report("gpu-a"))
    assert summary(await fleet_events(registry))[3:] == [(["gpu-a", "gpu-b"], ["gpu-a"], [])]


async def test_the_watcher_records_agents_that_went_silent(
    short_window: RegistryHarness,
) -> None:
    registry = short_window
    for agent_id in ("gpu-a", "gpu-b"):
        await post_status(registry, report(agent_id))
    watcher = FleetWatcher(registry.ctx.db, STALE_S)
    assert await watcher.tick() == 0, "the first look only learns the fleet"
    assert await watcher.tick() == 0
    await age_agent(registry, "gpu-b", STALE_S + 1)
    assert await watcher.tick() == 1
    assert await watcher.tick() == 0, "recorded once"
    assert summary(await fleet_events(registry))[-1] == (["gpu-a"], [], ["gpu-b"])
    # A change this process recorded itself (a join by report) is not recorded again.
    await post_status(registry, report("gpu-c"))
    watcher.noted(BASE_MODEL, ["gpu-a", "gpu-c"])
    assert await watcher.tick() == 0


async def test_fleet_events_reach_the_stream(short_window: RegistryHarness) -> None:
    registry = short_window
    await post_status(registry, report("gpu-a"), await registry.token("agent"))

    async def published() -> bool | None:
        return await all_published(registry.ctx.db) or None

    await eventually(published, timeout_s=30, what="the fleet event published")
    async with registry.ctx.db.session() as session:
        row = await session.scalar(select(EventRow).where(EventRow.type == "fleet_changed"))
    assert row is not None and row.subject == subject_for(FLEET_TENANT, "")
    assert row.stream_seq is not None


def test_the_staleness_window_is_a_setting_refused_when_bad(tmp_path: Path) -> None:
    assert RegistrySettings(data_dir=tmp_path).agent_stale_after_s == 90.0
    assert RegistrySettings(data_dir=tmp_path, agent_stale_after_s=10).agent_stale_after_s == 10
    for bad in (0, -5, 0.5, "soon", 8 * 24 * 3600):
        with pytest.raises(ValidationError, match="agent_stale_after_s"):
            RegistrySettings(data_dir=tmp_path, agent_stale_after_s=bad)
    assert check_interval(90) == 30 and check_interval(3) == 1 and check_interval(1) == 0.5
