"""A canary's row as the other domains see it: the alias's running canary, and its end.

Imports nothing of the aliases domain, which guards its moves with these.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, select
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.api.canaries import ACTIVE_STATES
from loraplane.events import CanaryRoute
from registry_service.adapters.models import Adapter
from registry_service.aliases.models import Alias
from registry_service.canaries.models import CanaryRow
from registry_service.db.base import utcnow
from registry_service.versions.models import Version
from registry_service.versions.refs import version_ref

_ACTIVE = sorted(ACTIVE_STATES)


def canary_route(adapter: Adapter, row: CanaryRow, version: Version) -> CanaryRoute:
    """What agents act on: the canary's id, weight and version."""
    return CanaryRoute(id=row.id, weight=row.weight, target=version_ref(adapter, version))


async def active_routes(session: AsyncSession, where: Sequence[ColumnElement[bool]]
                        ) -> dict[int, CanaryRoute]:
    """The running canary of each alias that has one, of the adapters matching ``where``
    (conditions on ``Adapter``), by alias id."""
    rows = await session.execute(
        select(CanaryRow, Version, Adapter)
        .join(Version, Version.id == CanaryRow.canary_version_id)
        .join(Alias, Alias.id == CanaryRow.alias_id)
        .join(Adapter, Adapter.id == Alias.adapter_id)
        .where(*where, CanaryRow.state.in_(_ACTIVE)))
    return {row.alias_id: canary_route(adapter, row, version)
            for row, version, adapter in rows.all()}


async def active_canary(session: AsyncSession, alias_id: int) -> CanaryRow | None:
    """The alias's progressing or paused canary, if any (the alias row is locked by the
    caller that means to change it)."""
    return await session.scalar(
        select(CanaryRow).where(CanaryRow.alias_id == alias_id,
                                CanaryRow.state.in_(_ACTIVE)))


def finish(row: CanaryRow, *, promoted: bool, reason: str | None, actor: str) -> None:
    """End a running canary: all traffic to the canary version, or none. Never commits."""
    row.state = "promoted" if promoted else "aborted"
    row.ended_by = actor
    row.weight = 100 if promoted else 0
    row.reason = reason
    row.updated_at = utcnow()
