"""Status reports carry the running canaries' traffic; while a canary runs here, counts
that moved are posted every ``canary_report_interval_s`` (no debounce, but a move under
way still holds the report), and nothing is posted when they did not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from devharness.waiting import eventually
from inference_agent.control.failures import VersionFailure
from inference_agent.node.status import StatusReporter
from inference_agent.serving.routes import CanarySide, RouteTable
from inference_agent.serving.traffic import TrafficTally
from loraplane.events import AgentStatus, CanaryRoute, VersionRef
from tests.agent.loop_support import FakeSwapper

CANARY_ID = 3
STABLE: CanarySide = (CANARY_ID, "stable")
CANARY: CanarySide = (CANARY_ID, "canary")


def ref(version: int) -> VersionRef:
    return VersionRef(adapter="bot", version=version, digest=f"{version:064x}",
                      base_model="tiny-llama", rank=8, alpha=16, target_modules=["q_proj"],
                      files=[])


class WatchedTally(TrafficTally):
    """Counts how often the reporter looks at the tally's version (once per look for
    news): a test waits for looks instead of for time."""

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    @property
    def version(self) -> int:
        self.looks += 1
        return super().version


@dataclass
class Moves:
    moving: dict[tuple[str, str], int | None] = field(default_factory=dict)

    def failures(self) -> list[VersionFailure]:
        return []

    def pending(self) -> dict[tuple[str, str], int | None]:
        return dict(self.moving)


class NothingLoaded:
    def loaded_names(self) -> list[str]:
        return []


@dataclass
class Rig:
    reporter: StatusReporter
    routes: RouteTable
    tally: WatchedTally
    moves: Moves
    posts: list[AgentStatus]


def canary_routes() -> RouteTable:
    routes = RouteTable("tiny-llama")
    routes.set_owner("bot", "acme")
    routes.set_alias("bot", "live", 1, ref(1))
    routes.set_canary("bot", "live", CanaryRoute(id=CANARY_ID, weight=20, target=ref(2)))
    return routes


@asynccontextmanager
async def reporting(*, heartbeat_s: float = 600, interval_s: float = 0.05,
                    routes: Callable[[], RouteTable] = canary_routes) -> AsyncIterator[Rig]:
    """A running reporter whose debounce and settle are ten minutes: a post that comes
    sooner came by the traffic's interval (or the heartbeat), not by either."""
    table, tally, moves, posts = routes(), WatchedTally(), Moves(), list[AgentStatus]()

    async def post(status: AgentStatus) -> None:
        posts.append(status)

    reporter = StatusReporter(agent_id="gpu-1", base_model="tiny-llama", routes=table,
                              cache=NothingLoaded(), swapper=FakeSwapper(table),
                              sources=[moves], post=post, heartbeat_interval_s=heartbeat_s,
                              debounce_s=600, settle_max_s=600, tally=tally,
                              canary_report_interval_s=interval_s)
    task = asyncio.create_task(reporter.run())
    try:
        await eventually(lambda: len(posts) == 1, what="the first report")
        yield Rig(reporter, table, tally, moves, posts)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_every_report_carries_the_running_canaries_traffic() -> None:
    routes, tally = canary_routes(), TrafficTally()
    reporter = StatusReporter(agent_id="gpu-1", base_model="tiny-llama", routes=routes,
                              cache=NothingLoaded(), swapper=FakeSwapper(routes),
                              sources=[], post=_never, heartbeat_interval_s=30, tally=tally)
    assert reporter.build().traffic == []
    tally.record(CANARY, 500, 0.2)
    tally.record(STABLE, 200, 0.1)
    tally.record((CANARY_ID + 1, "canary"), 200, 0.1)  # a canary that ended: not reported
    traffic = reporter.build().traffic
    assert [(t.canary_id, t.track, t.requests, t.errors) for t in traffic] == [
        (CANARY_ID, "canary", 1, 1), (CANARY_ID, "stable", 1, 0)]
    routes.set_canary("bot", "live", None)
    assert reporter.build().traffic == []


async def _never(status: AgentStatus) -> None:
    raise AssertionError("not posted in this test")


async def test_news_goes_out_at_the_canary_interval_and_no_news_stays_home() -> None:
    async with reporting() as rig:
        rig.tally.record(STABLE, 200, 0.1)
        await eventually(lambda: len(rig.posts) == 2, what="the traffic posted")
        assert [(t.track, t.requests) for t in rig.posts[-1].traffic] == [("stable", 1)]
        # Nothing new: the reporter looks several times and posts nothing.
        looks = rig.tally.looks
        await eventually(lambda: rig.tally.looks >= looks + 3, what="three looks for news")
        assert len(rig.posts) == 2
        rig.tally.first_token(CANARY, 0.01)
        rig.tally.record(CANARY, 503, 0.02)
        await eventually(lambda: len(rig.posts) == 3, what="the next traffic posted")
        canary, stable = rig.posts[-1].traffic
        assert (canary.track, canary.requests, canary.errors) == ("canary", 1, 1)
        assert canary.ttft[:3] == [0, 1, 1]  # 0.01 s: counted from the 0.01 s bucket on
        assert (stable.track, stable.requests) == ("stable", 1)


async def test_the_heartbeat_still_posts_when_a_canary_runs_without_news() -> None:
    async with reporting(heartbeat_s=0.3) as rig:
        await eventually(lambda: len(rig.posts) >= 3, what="two heartbeats")
        assert rig.tally.looks >= 2  # looked for news in between, found none
        assert all(post.traffic == [] for post in rig.posts)


async def test_traffic_waits_for_a_move_under_way_like_any_change() -> None:
    async with reporting() as rig:
        rig.moves.moving[("bot", "live")] = 2  # a move under way, its notice not yet sent
        rig.tally.record(STABLE, 200, 0.1)
        await eventually(lambda: rig.reporter.holding, what="the report held for the move")
        assert len(rig.posts) == 1
        rig.moves.moving.clear()
        rig.reporter.changed()  # the move ends, and says so
        await eventually(lambda: len(rig.posts) == 2, what="the report after the move")
        assert [t.requests for t in rig.posts[-1].traffic] == [1]

