"""Use cases of adapters: create, list, show, update (placement), delete."""

from __future__ import annotations

import base64

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import (
    AdapterCreated,
    AdapterDeleted,
    AdapterNameFreed,
    PlacementChanged,
)
from loraplane.naming import is_slug
from registry_service.adapters.lookup import get_visible_adapter
from registry_service.adapters.models import Adapter
from registry_service.adapters.schemas import (
    AdapterCreate,
    AdapterOut,
    AdapterPage,
    AdapterUpdate,
    AliasOut,
)
from registry_service.aliases.models import Alias
from registry_service.aliases.service import (
    alias_versions,
    aliases_by_adapter,
    remove_all_aliases,
)
from registry_service.auth.roles import Principal, Role
from registry_service.db.base import utcnow
from registry_service.errors import BadRequest, Conflict, Forbidden, InvalidInput, NotFound
from registry_service.events.service import envelope, record_audit, record_event
from registry_service.routing.service import drop_routes_to
from registry_service.tenants.models import Tenant
from registry_service.tenants.service import get_or_create_tenant

# More owners than this is every agent of any fleet we plan for: say "no placement".
MAX_REPLICAS = 1000


def _check_replicas(replicas: int | None) -> None:
    if replicas is not None and not 1 <= replicas <= MAX_REPLICAS:
        raise InvalidInput(f"replicas must be 1-{MAX_REPLICAS}, or null for no placement",
                           code="invalid_replicas",
                           detail={"replicas": replicas, "min": 1, "max": MAX_REPLICAS})


def _target_tenant(principal: Principal, requested: str | None) -> str:
    if principal.is_global:
        if requested is None:
            raise BadRequest("a global token must name the tenant", code="tenant_required")
        return requested
    if requested not in (None, principal.tenant):
        raise Forbidden("the token may not create adapters in another tenant",
                        code="tenant_forbidden", detail={"tenant": requested})
    assert principal.tenant is not None
    return principal.tenant


async def create_adapter(
    session: AsyncSession, principal: Principal, data: AdapterCreate
) -> AdapterOut:
    principal.require(Role.PUBLISHER)
    _check_replicas(data.replicas)
    tenant = await get_or_create_tenant(session, _target_tenant(principal, data.tenant))
    existing = await session.scalar(select(Adapter.id).where(Adapter.name == data.name))
    if existing is not None:
        raise _name_taken(data.name)
    adapter = Adapter(name=data.name, tenant=tenant, tenant_id=tenant.id,
                      base_model=data.base_model, description=data.description,
                      replicas=data.replicas)
    session.add(adapter)
    record_audit(session, AdapterCreated(**envelope(tenant.name, data.name),
                                         base_model=data.base_model), actor=principal.name)
    try:
        await session.commit()
    except IntegrityError as exc:
        await session.rollback()
        raise _name_taken(data.name) from exc
    return await _out(session, adapter)


def _name_taken(name: str) -> Conflict:
    """Names are global, like S3 bucket names. The answer is the same whoever holds the
    name (the caller's tenant, another one, or a deleted adapter: retired), so that it
    tells nothing about other tenants' adapters."""
    return Conflict(f"the adapter name {name!r} is taken", code="adapter_name_taken",
                    detail={"adapter": name})


def _freed_name(adapter: Adapter) -> str:
    # Not a slug ("~"), so no adapter can be created under it; the id keeps it unique.
    return f"~{adapter.id}~{adapter.name}"[:63]


async def free_retired_name(session: AsyncSession, principal: Principal, name: str) -> None:
    """Let the retired name of a deleted adapter be created again (global admins), and
    commit. The deleted adapter keeps its versions under a name no one can create."""
    if not principal.is_global_admin:
        raise Forbidden("only a global admin frees a retired name", code="insufficient_role",
                        detail={"required": "admin (global)", "actual": principal.role.value})
    adapter = await session.scalar(
        select(Adapter).where(Adapter.name == name, Adapter.deleted_at.is_not(None))
        .with_for_update(of=Adapter))
    if adapter is None:
        raise NotFound(f"no deleted adapter holds the name {name!r}",
                       code="retired_name_not_found", detail={"adapter": name})
    adapter.name = _freed_name(adapter)
    record_audit(session, AdapterNameFreed(**envelope(adapter.tenant.name, name)),
                 actor=principal.name)
    await session.commit()


def _alias_out(found: list[tuple[Alias, int | None]]) -> list[AliasOut]:
    # A removed alias keeps its row pointing nowhere: it is not one of the adapter's.
    return [AliasOut(alias=a.name, version=num, revision=a.revision, updated_at=a.updated_at)
            for a, num in found if a.version_id is not None]


async def _out(session: AsyncSession, adapter: Adapter, *, aliases: bool = False) -> AdapterOut:
    found = await alias_versions(session, adapter) if aliases else []
    return _adapter_out(adapter, _alias_out(found))


def _adapter_out(adapter: Adapter, aliases: list[AliasOut]) -> AdapterOut:
    return AdapterOut(
        name=adapter.name, tenant=adapter.tenant.name, base_model=adapter.base_model,
        description=adapter.description, latest_version=adapter.last_version or None,
        created_at=adapter.created_at, aliases=aliases, replicas=adapter.replicas,
    )


async def show_adapter(session: AsyncSession, principal: Principal, name: str) -> AdapterOut:
    principal.require(Role.READER)
    adapter = await get_visible_adapter(session, principal, name)
    return await _out(session, adapter, aliases=True)


def _encode_cursor(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode()


def _decode_cursor(cursor: str) -> str:
    try:
        name = base64.urlsafe_b64decode(cursor.encode()).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest("the cursor is not valid", code="invalid_cursor") from exc
    # A cursor is an adapter name we handed out; anything else (a NUL byte, which
    # Postgres refuses in text) is not one.
    if not is_slug(name):
        raise BadRequest("the cursor is not valid", code="invalid_cursor")
    return name


async def list_adapters(
    session: AsyncSession, principal: Principal, *, tenant: str | None,
    base_model: str | None, limit: int, cursor: str | None,
) -> AdapterPage:
    principal.require(Role.READER)
    query = select(Adapter).join(Tenant).where(Adapter.deleted_at.is_(None))
    if not principal.is_global:
        query = query.where(Adapter.tenant_id == principal.tenant_id)
    if tenant is not None:
        query = query.where(Tenant.name == tenant)
    if base_model is not None:
        query = query.where(Adapter.base_model == base_model)
    if cursor is not None:
        query = query.where(Adapter.name > _decode_cursor(cursor))
    rows = list(await session.scalars(query.order_by(Adapter.name).limit(limit + 1)))
    # Every listed adapter's aliases in one query, not one per adapter.
    found = await aliases_by_adapter(session, [a.id for a in rows[:limit]])
    page = [_adapter_out(a, _alias_out(found[a.id])) for a in rows[:limit]]
    next_cursor = _encode_cursor(rows[limit - 1].name) if len(rows) > limit else None
    return AdapterPage(adapters=page, next_cursor=next_cursor)


async def update_adapter(
    session: AsyncSession, principal: Principal, name: str, data: AdapterUpdate
) -> AdapterOut:
    """Change the fields sent. A new placement is published so agents re-place it now,
    not at their next resync."""
    principal.require(Role.PUBLISHER)
    sent = data.model_fields_set
    if "replicas" in sent:
        _check_replicas(data.replicas)
    adapter = await get_visible_adapter(session, principal, name, for_update=True)
    if "description" in sent and data.description is not None:
        adapter.description = data.description
    if "replicas" in sent and data.replicas != adapter.replicas:
        adapter.replicas = data.replicas
        event = PlacementChanged(**envelope(adapter.tenant.name, adapter.name),
                                 base_model=adapter.base_model, replicas=data.replicas)
        record_event(session, event, actor=principal.name)
    await session.commit()
    return await _out(session, adapter, aliases=True)


async def delete_adapter(session: AsyncSession, principal: Principal, name: str) -> None:
    """Retire an adapter: every alias is removed (agents unload it) and its routes go."""
    principal.require(Role.ADMIN)
    adapter = await get_visible_adapter(session, principal, name, for_update=True)
    await remove_all_aliases(session, adapter, action="adapter_deleted", actor=principal.name)
    await drop_routes_to(session, adapter, actor=principal.name)
    adapter.deleted_at = utcnow()
    event = AdapterDeleted(**envelope(adapter.tenant.name, adapter.name),
                           base_model=adapter.base_model)
    record_event(session, event, actor=principal.name)
    await session.commit()
