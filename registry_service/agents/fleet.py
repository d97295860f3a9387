"""Fleet membership as events: an agent joining or leaving publishes ``fleet_changed``.

Agents place adapters over the live agents of their base model (``loraplane.placement``).
They learn the fleet from the desired-state snapshot at each resync; a ``fleet_changed``
event tells them at once, with the whole live fleet in it, so each agent re-places
without reading anything. A join is recorded with the report that makes the agent live
(its first, or its first after going stale), a graceful leave with the agent's last
report, both in the report's transaction. An agent that stops reporting is seen by the
``FleetWatcher``: it compares the live fleet with the one it saw last, every third of
the staleness window, and records the difference. Two registry replicas may both
record one change: a repeated fleet event changes nothing on an agent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import FLEET_TENANT, FleetChanged
from registry_service.agents.models import AgentRow
from registry_service.background import BackgroundTask
from registry_service.db.base import utcnow
from registry_service.db.engine import Database
from registry_service.errors import RegistryError
from registry_service.events.service import envelope, record_event

log = logging.getLogger(__name__)

FLEET_ACTOR = "registry:fleet"
Fleets = dict[str, frozenset[str]]


def check_interval(stale_after_s: float) -> float:
    """How often the watcher looks: a leave is seen within 4/3 of the window."""
    return min(max(stale_after_s / 3, 0.5), 30.0)


async def live_fleets(session: AsyncSession, stale_after_s: float) -> Fleets:
    """base model -> its live agents (a report within ``stale_after_s``), in one query."""
    since = utcnow() - timedelta(seconds=stale_after_s)
    rows = await session.execute(select(AgentRow.base_model, AgentRow.agent_id)
                                 .where(AgentRow.last_seen_at >= since))
    fleets: dict[str, set[str]] = {}
    for base_model, agent_id in rows:
        fleets.setdefault(base_model, set()).add(agent_id)
    return {base: frozenset(agents) for base, agents in fleets.items()}


def record_fleet_change(session: AsyncSession, base_model: str, agents: Iterable[str], *,
                        joined: Iterable[str] = (), left: Iterable[str] = ()) -> None:
    """Add a ``fleet_changed`` event to the caller's transaction. Never commits."""
    event = FleetChanged(**envelope(FLEET_TENANT, ""), base_model=base_model,
                         agents=sorted(agents), joined=sorted(joined), left=sorted(left))
    record_event(session, event, actor=FLEET_ACTOR)


class FleetWatcher(BackgroundTask):
    """Records a ``fleet_changed`` event for each base model whose live fleet changed
    since its last look (agents gone stale, or joined through another replica)."""

    task_name = "fleet-watcher"

    def __init__(self, db: Database, stale_after_s: float) -> None:
        self._db = db
        self.stale_after_s = stale_after_s
        self.interval_s = check_interval(stale_after_s)
        self._seen: Fleets | None = None
        self.recorded = 0

    def noted(self, base_model: str, agents: Iterable[str]) -> None:
        """A fleet change this process recorded itself: not to be recorded again."""
        if self._seen is not None:
            self._seen = {**self._seen, base_model: frozenset(agents)}

    async def tick(self) -> int:
        """One look; how many fleet changes it recorded."""
        async with self._db.session() as session:
            now = await live_fleets(session, self.stale_after_s)
            seen = self._seen
            if seen is None:
                self._seen = now
                return 0  # the first look only learns the fleet
            changed = 0
            for base_model in sorted(set(seen) | set(now)):
                before, after = seen.get(base_model, frozenset()), now.get(base_model,
                                                                              frozenset())
                if before != after:
                    record_fleet_change(session, base_model, after, joined=after - before,
                                        left=before - after)
                    changed += 1
            if changed:
                await session.commit()
        self._seen = now  # only once recorded: a failed commit is tried again next look
        self.recorded += changed
        return changed

    async def _run(self) -> None:
        while True:
            try:
                changed = await self.tick()
                if changed:
                    log.info("fleet: %d base model(s) changed members", changed)
            except (RegistryError, SQLAlchemyError) as exc:
                log.warning("fleet watcher: %s; trying again later", exc)
            await asyncio.sleep(self.interval_s)
