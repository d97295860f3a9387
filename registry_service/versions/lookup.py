"""Finding one version of an adapter (a missing one answers 404)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from registry_service.adapters.models import Adapter
from registry_service.errors import NotFound
from registry_service.versions.models import Version


async def get_version(session: AsyncSession, adapter: Adapter, number: int) -> Version:
    version = await session.scalar(
        select(Version).where(Version.adapter_id == adapter.id, Version.number == number)
    )
    if version is None:
        raise NotFound(f"version {number} of {adapter.name!r} not found",
                       code="version_not_found",
                       detail={"adapter": adapter.name, "version": number})
    return version


async def version_by_id(session: AsyncSession, version_id: int | None) -> Version | None:
    return await session.get(Version, version_id) if version_id is not None else None

