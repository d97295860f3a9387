"""Finding an adapter the caller may see (another tenant's answers 404)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from registry_service.adapters.models import Adapter
from registry_service.auth.roles import Principal
from registry_service.errors import NotFound


def adapter_not_found(name: str) -> NotFound:
    return NotFound(f"adapter {name!r} not found", code="adapter_not_found",
                    detail={"adapter": name})


async def get_visible_adapter(
    session: AsyncSession, principal: Principal, name: str, *, for_update: bool = False
) -> Adapter:
    query = select(Adapter).where(Adapter.name == name, Adapter.deleted_at.is_(None))
    if for_update:
        query = query.with_for_update(of=Adapter)
    adapter = await session.scalar(query)
    if adapter is None or not principal.can_see(adapter.tenant_id):
        raise adapter_not_found(name)
    return adapter
