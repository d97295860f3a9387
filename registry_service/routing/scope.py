"""Which tenant's routing rules a call means: its token's, or the one it names."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from registry_service.auth.roles import Principal
from registry_service.errors import Forbidden, NotFound
from registry_service.tenants.models import Tenant


@dataclass(frozen=True, slots=True)
class TenantScope:
    """``tenant_id`` None: every tenant (a global token that named none). ``empty``: a
    named tenant that does not exist, so there is nothing to list."""

    tenant_id: int | None
    empty: bool = False


async def tenant_scope(session: AsyncSession, principal: Principal, tenant: str | None, *,
                       missing_ok: bool = False) -> TenantScope:
    """A tenant-scoped token means its own tenant and may name no other (403, as when it
    creates an adapter elsewhere). A global token means the tenant it names, if any."""
    if not principal.is_global:
        if tenant not in (None, principal.tenant):
            raise Forbidden("the token may not manage another tenant's routes",
                            code="tenant_forbidden", detail={"tenant": tenant})
        return TenantScope(principal.tenant_id)
    if tenant is None:
        return TenantScope(None)
    tenant_id = await session.scalar(select(Tenant.id).where(Tenant.name == tenant))
    if tenant_id is not None:
        return TenantScope(tenant_id)
    if missing_ok:
        return TenantScope(None, empty=True)
    raise NotFound(f"tenant {tenant!r} not found", code="tenant_not_found",
                   detail={"tenant": tenant})
