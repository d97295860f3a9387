"""Every alias's convergence across the fleet, for the registry's metrics.

The same rule as ``rollout.alias_rollout`` (fresh agents of the adapter's base model owe
the alias's version; an entry without an alias counts for the aliases pointing at its
version), computed for all aliases at once through an index of the reports, so a scrape
costs one pass over the reports and one over the aliases rather than their product.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import AgentStatus
from registry_service.adapters.models import Adapter
from registry_service.agents.models import AgentRow
from registry_service.agents.service import DEFAULT_STALE_AFTER_S
from registry_service.aliases.models import Alias
from registry_service.db.base import as_utc, utcnow
from registry_service.db.engine import Database
from registry_service.errors import RegistryError
from registry_service.metrics import AliasConvergence, RegistryMetrics
from registry_service.versions.models import Version

log = logging.getLogger(__name__)
# (adapter, alias or None, version): what an agent reported about one version.
_Key = tuple[str, str | None, int]


@dataclass(frozen=True, slots=True)
class _Target:
    adapter: str
    base_model: str
    alias: str
    version: int


@dataclass
class _Index:
    """Per base model, how many fresh agents there are; per key, the fresh agents that
    serve it or failed it."""

    fleet: dict[str, int]
    serving: dict[_Key, set[str]]
    failed: dict[_Key, set[str]]

    def count(self, which: dict[_Key, set[str]], t: _Target) -> int:
        return len(which.get((t.adapter, t.alias, t.version), set())
                   | which.get((t.adapter, None, t.version), set()))


def _index(rows: list[AgentRow], now: datetime, stale_after_s: float) -> _Index:
    index = _Index(fleet=defaultdict(int), serving=defaultdict(set), failed=defaultdict(set))
    for row in rows:
        if (now - as_utc(row.last_seen_at)).total_seconds() > stale_after_s:
            continue
        index.fleet[row.base_model] += 1
        status = AgentStatus.model_validate(row.status)
        for s in status.served:
            if s.state in ("serving", "failed"):
                which = index.serving if s.state == "serving" else index.failed
                which[(s.adapter, s.alias, s.version)].add(row.agent_id)
        for f in status.failures:
            index.failed[(f.adapter, f.alias, f.version)].add(row.agent_id)
    return index


async def _targets(session: AsyncSession) -> list[_Target]:
    query = (select(Adapter.name, Adapter.base_model, Alias.name, Version.number)
             .join(Alias, Alias.adapter_id == Adapter.id)
             .join(Version, Version.id == Alias.version_id)
             .where(Adapter.deleted_at.is_(None))
             .order_by(Adapter.name, Alias.name))
    return [_Target(*row) for row in await session.execute(query)]


async def fleet_convergence(
    session: AsyncSession, stale_after_s: float,
) -> tuple[list[AliasConvergence], dict[str, datetime]]:
    """Each live alias's convergence, and when each agent last reported."""
    now = utcnow()
    rows = list(await session.scalars(select(AgentRow)))
    index = _index(rows, as_utc(now), stale_after_s)
    aliases = [
        AliasConvergence(adapter=t.adapter, alias=t.alias,
                         expected=index.fleet.get(t.base_model, 0),
                         converged=index.count(index.serving, t),
                         failed=index.count(index.failed, t))
        for t in await _targets(session)
    ]
    return aliases, {row.agent_id: as_utc(row.last_seen_at) for row in rows}


async def refresh_fleet_metrics(db: Database, metrics: RegistryMetrics,
                                stale_after_s: float = DEFAULT_STALE_AFTER_S) -> None:
    """Recompute the fleet's gauges from the database; on a database error they keep
    their last values (the scrape still answers, and ``up`` stays about the process)."""
    try:
        async with db.session() as session:
            aliases, last_reports = await fleet_convergence(session, stale_after_s)
    except (RegistryError, SQLAlchemyError) as exc:
        log.warning("could not read the fleet for the metrics: %s", exc)
        return
    metrics.set_fleet(aliases, last_reports)
