"""A canary's row as the other domains see it: the alias's running canary, and its end.

Imports nothing of the aliases domain, which guards its moves with these.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.api.canaries import ACTIVE_STATES
from registry_service.canaries.models import CanaryRow
from registry_service.db.base import utcnow
from registry_service.versions.models import Version


async def active_routes(session: AsyncSession, alias_ids: Sequence[int]
                        ) -> dict[int, tuple[CanaryRow, Version]]:
    """The running canary of each alias that has one, with its canary version, by alias id."""
    if not alias_ids:
        return {}
    rows = await session.execute(
        select(CanaryRow, Version).join(Version, Version.id == CanaryRow.canary_version_id)
        .where(CanaryRow.alias_id.in_(alias_ids),
               CanaryRow.state.in_(sorted(ACTIVE_STATES))))
    return {row.alias_id: (row, version) for row, version in rows.all()}


async def active_canary(session: AsyncSession, alias_id: int) -> CanaryRow | None:
    """The alias's progressing or paused canary, if any (the alias row is locked by the
    caller that means to change it)."""
    return await session.scalar(
        select(CanaryRow).where(CanaryRow.alias_id == alias_id,
                                CanaryRow.state.in_(sorted(ACTIVE_STATES))))


def finish(row: CanaryRow, *, promoted: bool, reason: str | None) -> None:
    """End a running canary: all traffic to the canary version, or none. Never commits."""
    row.state = "promoted" if promoted else "aborted"
    row.weight = 100 if promoted else 0
    row.reason = reason
    row.updated_at = utcnow()
