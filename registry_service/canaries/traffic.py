"""What the agents served on each side of a running canary, and a step's window of it.

Agents report cumulative counts (``CanaryTraffic``); ``record_traffic`` keeps the last
of each agent and side. ``rebase`` opens a window (at a step's start) by taking the
counts as they are as its base; ``windows`` sums, over every agent, what was counted
since. Callers commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.api.canaries import ACTIVE_STATES
from loraplane.events import TRAFFIC_BUCKETS, CanaryTrack, CanaryTraffic
from registry_service.canaries.analysis import VersionWindow
from registry_service.canaries.models import CanaryRow, CanaryTrafficRow
from registry_service.db.base import utcnow

_BOUNDS = (*TRAFFIC_BUCKETS, float("inf"))
_ZERO = [0] * len(_BOUNDS)


async def record_traffic(session: AsyncSession, agent_id: str,
                         entries: Sequence[CanaryTraffic]) -> None:
    """Keep an agent's report of running canaries (others are ignored: one that ended,
    or an id no canary has)."""
    ids = {entry.canary_id for entry in entries}
    running = set(await session.scalars(
        select(CanaryRow.id).where(CanaryRow.id.in_(ids),
                                   CanaryRow.state.in_(sorted(ACTIVE_STATES)))))
    if not running:
        return
    rows = {(row.canary_id, row.track): row for row in await session.scalars(
        select(CanaryTrafficRow)
        .where(CanaryTrafficRow.canary_id.in_(running), CanaryTrafficRow.agent_id == agent_id)
        .with_for_update())}
    now = utcnow()
    for entry in entries:
        if entry.canary_id not in running:
            continue
        row = rows.get((entry.canary_id, entry.track))
        if row is None:
            row = CanaryTrafficRow(canary_id=entry.canary_id, agent_id=agent_id,
                                   track=entry.track, base_requests=0, base_errors=0)
            session.add(row)
        elif entry.requests < row.requests:  # the agent started counting again
            _keep_counted(row)
        row.requests, row.errors = entry.requests, entry.errors
        row.latency, row.ttft = list(entry.latency), list(entry.ttft)
        row.load_failures, row.updated_at = entry.load_failures, now


def _keep_counted(row: CanaryTrafficRow) -> None:
    """Lower the base by what the window held, so the new counts add to it."""
    row.base_requests -= row.requests
    row.base_errors -= row.errors
    row.base_latency = _minus(row.base_latency, row.latency)
    row.base_ttft = _minus(row.base_ttft, row.ttft)


def _minus(a: Sequence[int] | None, b: Sequence[int]) -> list[int]:
    return [x - y for x, y in zip(a or _ZERO, b, strict=True)]


async def rebase(session: AsyncSession, canary_id: int) -> None:
    """Open a new window: what is counted now is its base."""
    await session.execute(
        update(CanaryTrafficRow).where(CanaryTrafficRow.canary_id == canary_id)
        .values(base_requests=CanaryTrafficRow.requests, base_errors=CanaryTrafficRow.errors,
                base_latency=CanaryTrafficRow.latency, base_ttft=CanaryTrafficRow.ttft)
        .execution_options(synchronize_session=False))


async def windows(session: AsyncSession, canary_id: int) -> dict[CanaryTrack, VersionWindow]:
    """Each side's window, over every agent that reported it."""
    rows = list(await session.scalars(
        select(CanaryTrafficRow).where(CanaryTrafficRow.canary_id == canary_id)))
    return {"stable": _window(row for row in rows if row.track == "stable"),
            "canary": _window(row for row in rows if row.track == "canary")}


def _window(rows: Iterable[CanaryTrafficRow]) -> VersionWindow:
    requests = errors = load_failures = 0
    latency, ttft = list(_ZERO), list(_ZERO)
    for row in rows:
        requests += max(0, row.requests - row.base_requests)
        errors += max(0, row.errors - row.base_errors)
        load_failures += row.load_failures
        _add(latency, row.latency, row.base_latency)
        _add(ttft, row.ttft, row.base_ttft)
    return VersionWindow(requests=requests, errors=errors, load_failures=load_failures,
                         latency=list(zip(_BOUNDS, latency, strict=True)),
                         ttft=list(zip(_BOUNDS, ttft, strict=True)))


def _add(total: list[int], counts: Sequence[int], base: Sequence[int] | None) -> None:
    for i, (count, before) in enumerate(zip(counts, base or _ZERO, strict=True)):
        total[i] += max(0, count - before)
