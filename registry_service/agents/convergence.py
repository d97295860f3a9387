"""Every alias's convergence across the fleet, for the registry's metrics.

The same rule as ``rollout.alias_rollout`` (fresh agents of the adapter's base model owe
the alias's version; an entry without an alias counts for the aliases pointing at its
version), computed for all aliases at once through an index of the reports, so a scrape
costs one pass over the reports and one over the aliases rather than their product.
That pass, and writing the metrics out, run on worker threads: at 100 agents reporting
500 adapters each, they held the event loop for about 400 ms a scrape.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from registry_service.adapters.models import Adapter
from registry_service.agents.report_read import (
    StoredReport,
    gc_paused,
    parse_status,
    stored_reports,
)
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


def _index(reports: list[StoredReport], now: datetime, stale_after_s: float) -> _Index:
    index = _Index(fleet=defaultdict(int), serving=defaultdict(set), failed=defaultdict(set))
    for row in reports:
        if (now - as_utc(row.last_seen_at)).total_seconds() > stale_after_s:
            continue
        index.fleet[row.base_model] += 1
        status = parse_status(row)
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


def fleet_convergence(reports: list[StoredReport], targets: list[_Target], now: datetime,
                      stale_after_s: float) -> list[AliasConvergence]:
    """Each live alias's convergence. CPU only (every report parsed): run it on a worker
    thread."""
    index = _index(reports, as_utc(now), stale_after_s)
    return [AliasConvergence(adapter=t.adapter, alias=t.alias,
                             expected=index.fleet.get(t.base_model, 0),
                             converged=index.count(index.serving, t),
                             failed=index.count(index.failed, t))
            for t in targets]


def _set_fleet(metrics: RegistryMetrics, reports: list[StoredReport], targets: list[_Target],
               now: datetime, stale_after_s: float) -> None:
    with gc_paused():
        aliases = fleet_convergence(reports, targets, now, stale_after_s)
    last_reports = {row.agent_id: as_utc(row.last_seen_at) for row in reports}
    with metrics.lock:
        metrics.set_fleet(aliases, last_reports)


def render_metrics(metrics: RegistryMetrics) -> bytes:
    """The metrics' text (hundreds of KB with a thousand aliases): on a worker thread."""
    with metrics.lock:
        return metrics.render()


async def refresh_fleet_metrics(db: Database, metrics: RegistryMetrics,
                                stale_after_s: float = DEFAULT_STALE_AFTER_S) -> bool:
    """Recompute the fleet's gauges from the database, off the loop; on a database error
    they keep their last values (the scrape still answers, and ``up`` stays about the
    process) and this returns False."""
    try:
        async with db.session() as session:
            reports = await stored_reports(session)
            targets = await _targets(session)
    except (RegistryError, SQLAlchemyError) as exc:
        log.warning("could not read the fleet for the metrics: %s", exc)
        return False
    await asyncio.to_thread(_set_fleet, metrics, reports, targets, utcnow(), stale_after_s)
    return True


class FleetGauges:
    """The fleet's gauges for scrapes, recomputed at most once per ``max_age_s``.

    A recomputation parses every agent's report: CPU that grows with agents x adapters
    and, though off the loop, holds the GIL the loop needs. Scrapers (Prometheus
    replicas, dashboards, a benchmark's poll) may ask far more often than the gauges
    need to move; between recomputations they read the last values. Concurrent scrapes
    share one recomputation.
    """

    def __init__(self, db: Database, metrics: RegistryMetrics, *, stale_after_s: float,
                 max_age_s: float) -> None:
        self._db, self._metrics = db, metrics
        self._stale_after_s, self._max_age_s = stale_after_s, max_age_s
        self._lock = asyncio.Lock()
        self._fresh_until: float | None = None

    async def refresh(self) -> None:
        async with self._lock:
            if self._fresh_until is not None and time.monotonic() < self._fresh_until:
                return
            started = time.monotonic()
            if await refresh_fleet_metrics(self._db, self._metrics, self._stale_after_s):
                self._fresh_until = started + self._max_age_s
