"""The follower against a real NATS JetStream and a real registry served over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import nats
import pytest
from nats.js.api import DeliverPolicy
from sqlalchemy import func, select

from devharness.adapters import make_adapter
from devharness.services import NatsService
from devharness.waiting import eventually
from inference_agent.control.follower import EVENTS_PER_STEP, Follower, consumer_name
from inference_agent.control.keys import ALL, ROUTES, key_for
from inference_agent.control.workqueue import Backoff
from inference_agent.metrics import AgentMetrics
from inference_agent.node.registry_client import RegistryLink
from loraplane.events import STREAM_NAME, DesiredState, RouteChanged, RouteRule
from registry_service.events.models import EventRow
from tests.agent.loop_support import ServedRegistry, served_registry
from tests.agent.trust_support import trusting
from tests.loop_steps import longest_run, probing

BASE = "tiny-llama"


@pytest.fixture
async def reg(tmp_path: Path, nats: NatsService) -> AsyncIterator[ServedRegistry]:
    async with served_registry(tmp_path, nats) as served:
        yield served


async def unpublished(reg: ServedRegistry) -> int:
    async with reg.harness.ctx.db.session() as session:
        count = await session.scalar(select(func.count()).select_from(EventRow)
                                     .where(EventRow.published_at.is_(None)))
    return int(count or 0)


async def settled_snapshot(reg: ServedRegistry) -> DesiredState:
    """The agent's snapshot once the relay has published every event so far."""
    await eventually(lambda: _none_left(reg), timeout_s=20, what="outbox published")
    client = RegistryLink(reg.url, await reg.agent_token())
    try:
        return await client.desired(BASE)
    finally:
        await client.aclose()


async def _none_left(reg: ServedRegistry) -> bool:
    return await unpublished(reg) == 0


@asynccontextmanager
async def following(reg: ServedRegistry, nats_url: str, start_seq: int, keys: list[str],
                    agent_id: str = "gpu-1.example",
                    backoff: Backoff[str] | None = None) -> AsyncIterator[Follower]:
    """A follower for the block; ``backoff.failures("session")`` counts the sessions that
    broke or never started since the last good one."""
    follower = Follower(nats_url, agent_id=agent_id, base_model=BASE, enqueue=keys.append,
                        trust=trusting(reg.harness.ctx.relay.signer),
                        fetch_timeout_s=0.5, error_streak=2, connect_timeout_s=2,
                        request_timeout_s=2, backoff=backoff or Backoff(0.2, 1.0),
                        metrics=AgentMetrics())
    task = asyncio.create_task(follower.run(start_seq))
    try:
        yield follower
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_consumer_names_are_safe_and_distinct() -> None:
    assert consumer_name("gpu-1") == "agent-gpu-1"
    dotted, underscored = consumer_name("gpu.1"), consumer_name("gpu_1")
    assert dotted != underscored and dotted.startswith("agent-gpu_1-")
    assert not any(c in consumer_name("a b*c>d/e\\f:g") for c in " .*>/\\:")
    assert len(consumer_name("x" * 255)) < 220


def test_route_events_of_other_base_models_are_ignored() -> None:
    rule = RouteRule(kind="task", key="t", adapter="a", alias="live", tenant="acme",
                     base_model="other")
    common = {"event_id": "e", "seq": 1, "time": "2026-01-01T00:00:00Z", "tenant": "acme",
              "adapter": "a", "kind": "task", "key": "t"}
    assert key_for(RouteChanged.model_validate({**common, "rule": rule}), BASE) is None
    assert key_for(RouteChanged.model_validate({**common, "rule": None}), BASE) == ROUTES


async def test_follows_from_the_snapshot_without_missing_or_replaying(
        reg: ServedRegistry, nats: NatsService, tmp_path: Path) -> None:
    await reg.harness.create_adapter("early")
    await reg.publish("early", make_adapter(tmp_path / "early", seed=1))
    snapshot = await settled_snapshot(reg)
    assert snapshot.stream_seq >= 1
    # Published after the snapshot but before the agent subscribes: must not be lost.
    await reg.harness.create_adapter("bot")
    await reg.publish("bot", make_adapter(tmp_path / "bot1", seed=2))
    keys: list[str] = []
    async with following(reg, nats.url, snapshot.stream_seq + 1, keys) as follower:
        await eventually(lambda: "bot" in keys, what="bot queued")
        assert "early" not in keys, "events up to the snapshot are not replayed"
        assert follower.consumer == consumer_name("gpu-1.example")
        await reg.harness.create_adapter("elsewhere", base_model="other-model")
        await reg.publish("elsewhere", make_adapter(tmp_path / "else", seed=3,
                                                    base_model="other-model"))
        await reg.put_route("customer", "c1", "bot")
        await eventually(lambda: ROUTES in keys, what="route change queued")
        await reg.publish("bot", make_adapter(tmp_path / "bot2", seed=4))
        await eventually(lambda: keys.count("bot") >= 4, what="second bot version")
        assert "elsewhere" not in keys, "other base models are ignored"
        await _check_consumer(nats.url, follower.consumer, snapshot.stream_seq + 1)
        final = await settled_snapshot(reg)
        await eventually(lambda: follower.last_stream_seq == final.stream_seq,
                         what="every event handled")
        # Every event handled was timed from its commit in the registry.
        metrics = follower.metrics
        assert metrics is not None
        delays = metrics.registry.get_sample_value("loraplane_agent_event_delay_seconds_count")
        assert delays == follower.events_seen > 0
        total = metrics.registry.get_sample_value("loraplane_agent_event_delay_seconds_sum")
        assert total is not None and 0 <= total < 60 * follower.events_seen


async def test_a_restarted_agent_recreates_its_consumer_at_the_new_snapshot(
        reg: ServedRegistry, nats: NatsService, tmp_path: Path) -> None:
    await reg.harness.create_adapter("bot")
    await reg.publish("bot", make_adapter(tmp_path / "v1", seed=1))
    await settled_snapshot(reg)
    keys: list[str] = []
    async with following(reg, nats.url, 1, keys):
        await eventually(lambda: keys.count("bot") >= 2, what="history from seq 1")
    await reg.publish("bot", make_adapter(tmp_path / "v2", seed=2))
    second = await settled_snapshot(reg)
    keys.clear()
    async with following(reg, nats.url, second.stream_seq + 1, keys) as follower:
        await eventually(follower.connected.is_set, what="connected")
        # A marker: the stream delivers in order, so from the old consumer's position
        # v2's events would come before it.
        await reg.publish("bot", make_adapter(tmp_path / "v3", seed=3))
        third = await settled_snapshot(reg)
        await eventually(lambda: follower.last_stream_seq == third.stream_seq,
                         what="marker handled")
        assert follower.events_seen == third.stream_seq - second.stream_seq, \
            "the old consumer's position is not reused"
        assert keys == ["bot"] * follower.events_seen


async def test_outage_catches_up_and_queues_a_full_resync(
        reg: ServedRegistry, nats: NatsService, tmp_path: Path) -> None:
    await reg.harness.create_adapter("bot")
    await reg.publish("bot", make_adapter(tmp_path / "v1", seed=1))
    snapshot = await settled_snapshot(reg)
    keys: list[str] = []
    backoff: Backoff[str] = Backoff(0.2, 1.0)
    async with following(reg, nats.url, snapshot.stream_seq + 1, keys, backoff=backoff) as follower:
        await eventually(follower.connected.is_set, what="connected")
        nats.stop()
        # The registry keeps the change in its outbox while NATS is down.
        await reg.publish("bot", make_adapter(tmp_path / "v2", seed=2))
        relay, passes = reg.harness.ctx.relay, reg.harness.ctx.relay.passes
        await eventually(lambda: relay.passes >= passes + 2, timeout_s=20,
                         what="a relay pass since the publish")
        await eventually(lambda: backoff.failures("session") >= 1, timeout_s=20,
                         what="the follower's session broke")
        assert "bot" not in keys and await unpublished(reg) > 0
        nats.start()
        await eventually(lambda: "bot" in keys, timeout_s=30, what="caught up after outage")
        await eventually(lambda: ALL in keys, timeout_s=30, what="full resync queued")
        assert follower.consumer == consumer_name("gpu-1.example")


async def test_nats_down_at_start_is_waited_for(
        reg: ServedRegistry, nats: NatsService, tmp_path: Path) -> None:
    await reg.harness.create_adapter("bot")
    snapshot = await settled_snapshot(reg)
    nats.stop()
    keys: list[str] = []
    backoff: Backoff[str] = Backoff(0.2, 1.0)
    async with following(reg, nats.url, snapshot.stream_seq + 1, keys, backoff=backoff) as follower:
        await eventually(lambda: backoff.failures("session") >= 2, timeout_s=20,
                         what="two failed connects")
        assert not follower.connected.is_set() and follower.sessions == 0
        nats.start()
        await eventually(follower.connected.is_set, timeout_s=30, what="connected")
        await reg.publish("bot", make_adapter(tmp_path / "v1", seed=1))
        await eventually(lambda: "bot" in keys, timeout_s=30, what="event after late start")


async def _check_consumer(url: str, name: str, start_seq: int) -> None:
    client = await nats.connect(url)
    try:
        info = await client.jetstream().consumer_info(STREAM_NAME, name)
        assert info.config.durable_name == name
        assert info.config.deliver_policy == DeliverPolicy.BY_START_SEQUENCE
        assert info.config.opt_start_seq == start_seq
    finally:
        await client.close()


async def test_a_burst_of_waiting_events_is_handled_in_steps(
        reg: ServedRegistry, nats: NatsService, tmp_path: Path) -> None:
    # Events stored while the agent was away arrive together, and none of them makes
    # the follower wait: handled in one step, they would hold every request behind them.
    await reg.harness.create_adapter("bot")
    await reg.publish("bot", make_adapter(tmp_path / "bot", seed=1))
    snapshot = await settled_snapshot(reg)
    for index in range(64):
        await reg.put_route("customer", f"c{index}", "bot")
    final = await settled_snapshot(reg)
    log: list[str] = []
    async with probing(log), following(reg, nats.url, snapshot.stream_seq + 1,
                                       log) as follower:
        await eventually(lambda: follower.last_stream_seq == final.stream_seq,
                         what="every event handled")
    assert log.count(ROUTES) == 64
    assert longest_run(log, ROUTES) <= EVENTS_PER_STEP
