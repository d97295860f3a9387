"""The canaries' gauges, read from the database as ``/metrics`` is scraped: every
replica shows the same running canaries, whichever one analyses them."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from loraplane.api.canaries import ACTIVE_STATES
from registry_service.adapters.models import Adapter
from registry_service.aliases.models import Alias
from registry_service.canaries.judge import ANALYST_ACTOR
from registry_service.canaries.models import CanaryRow
from registry_service.db.base import as_utc, utcnow
from registry_service.db.engine import Database
from registry_service.metrics import CanaryGauges, RegistryMetrics

log = logging.getLogger(__name__)
ROLLED_BACK_WITHIN = timedelta(days=1)


def _values(checks: list[dict[str, Any]]) -> list[tuple[str, str, float]]:
    return [(check["metric"], side, float(check[side])) for check in checks
            for side in ("stable", "canary") if check.get(side) is not None]


def _gauges(row: CanaryRow, adapter: str, alias: str, now: datetime) -> CanaryGauges:
    paused = (now - as_utc(row.updated_at)).total_seconds() if row.state == "paused" else 0
    return CanaryGauges(adapter=adapter, alias=alias, state=row.state, step=row.step,
                        weight=row.weight, paused_s=max(0.0, paused),
                        values=_values(row.checks))


async def refresh_canary_metrics(db: Database, metrics: RegistryMetrics) -> None:
    """Set the canaries' gauges; on a database error they keep their last values."""
    now = utcnow()
    query = (select(CanaryRow, Adapter.name, Alias.name)
             .join(Alias, Alias.id == CanaryRow.alias_id)
             .join(Adapter, Adapter.id == Alias.adapter_id))
    try:
        async with db.session() as session:
            running = (await session.execute(
                query.where(CanaryRow.state.in_(sorted(ACTIVE_STATES))))).all()
            ended = (await session.execute(query.where(
                CanaryRow.state == "aborted", CanaryRow.ended_by == ANALYST_ACTOR,
                CanaryRow.updated_at >= now - ROLLED_BACK_WITHIN))).all()
    except SQLAlchemyError as exc:
        log.warning("could not read the canaries for the metrics: %s", exc)
        return
    gauges = [_gauges(row, adapter, alias, now) for row, adapter, alias in running]
    last: dict[tuple[str, str], datetime] = {}
    for row, adapter, alias in ended:
        when = as_utc(row.updated_at)
        last[(adapter, alias)] = max(when, last.get((adapter, alias), when))
    rolled_back = [(adapter, alias, when) for (adapter, alias), when in last.items()]
    await asyncio.to_thread(_set, metrics, gauges, rolled_back)


def _set(metrics: RegistryMetrics, gauges: list[CanaryGauges],
         rolled_back: list[tuple[str, str, datetime]]) -> None:
    with metrics.lock:
        metrics.set_canaries(gauges, rolled_back)
