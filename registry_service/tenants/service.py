"""Tenants are made when first named (by an adapter or a token created for them), never
twice under one name."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.naming import is_slug
from registry_service.errors import InvalidInput
from registry_service.tenants.models import Tenant


async def get_or_create_tenant(session: AsyncSession, name: str) -> Tenant:
    if not is_slug(name):
        raise InvalidInput(f"tenant {name!r} is not a valid slug", code="invalid_name",
                           detail={"field": "tenant"})
    tenant = await session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is not None:
        return tenant
    try:
        async with session.begin_nested():
            tenant = Tenant(name=name)
            session.add(tenant)
    except IntegrityError:
        # Another transaction created it first.
        tenant = await session.scalar(select(Tenant).where(Tenant.name == name))
        assert tenant is not None
    return tenant
