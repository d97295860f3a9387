"""Finding an adapter the caller may see (another tenant's answers 404)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, bindparam, select
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


# The same rule as get_visible_adapter, as a Core row of what a read needs (id, tenant,
# base model), built once: for reads on every request, where the ORM object cost more.
_A = Adapter.__table__.c
_VISIBLE = select(_A.id, _A.tenant_id, _A.base_model).where(
    _A.name == bindparam("name"), _A.deleted_at.is_(None))


async def visible_adapter_row(session: AsyncSession, principal: Principal,
                              name: str) -> Row[*tuple[Any, ...]]:
    row = (await session.execute(_VISIBLE, {"name": name})).first()
    if row is None or not principal.can_see(row.tenant_id):
        raise adapter_not_found(name)
    return row
