"""A report held for a move wakes when the move ends, not on a timer: with the deadline
(and, for a move, the debounce) ten minutes away, only the move's own notice can send
the report in time."""

from __future__ import annotations

import asyncio

import pytest

from devharness.waiting import eventually
from inference_agent.control.failures import VersionFailure
from inference_agent.node.status import StatusReporter
from inference_agent.serving.routes import RouteTable
from loraplane.events import AgentStatus
from tests.agent.loop_support import FakeSwapper


class Moves:
    def __init__(self) -> None:
        self.moving: dict[tuple[str, str], int | None] = {}

    def failures(self) -> list[VersionFailure]:
        return []

    def pending(self) -> dict[tuple[str, str], int | None]:
        return dict(self.moving)


class Loaded:
    def __init__(self) -> None:
        self.names: list[str] = []

    def loaded_names(self) -> list[str]:
        return list(self.names)


@pytest.mark.parametrize("debounce_s", [0, 600])
async def test_a_held_report_goes_when_the_move_ends(debounce_s: float) -> None:
    moves, posts = Moves(), list[AgentStatus]()

    async def post(status: AgentStatus) -> None:
        posts.append(status)

    routes, loaded = RouteTable("tiny-llama"), Loaded()
    reporter = StatusReporter(agent_id="gpu-1", base_model="tiny-llama", routes=routes,
                              cache=loaded, swapper=FakeSwapper(routes),
                              sources=[moves], post=post, heartbeat_interval_s=600,
                              debounce_s=debounce_s, settle_max_s=600)
    task = asyncio.create_task(reporter.run())
    try:
        await eventually(lambda: len(posts) == 1, what="the first report")
        moves.moving[("bot", "live")] = 2  # a move starts, and says so
        reporter.changed()
        await eventually(lambda: reporter.holding, what="the report held for the move")
        assert len(posts) == 1
        loaded.names = ["bot@2"]
        moves.moving.clear()  # the move ends, and says so
        reporter.changed()
        await eventually(lambda: len(posts) == 2, timeout_s=30,
                         what="the report sent when the move ended")
        assert not reporter.holding and posts[-1].loaded == ["bot@2"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
