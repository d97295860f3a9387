"""Routing rules: a customer, a task or a tenant's default names ``adapter@alias``.

A rule belongs to one tenant, the tenant of the adapter it names, and is unique per
``(tenant, kind, key)``: tenants never share or race for a key, and an agent resolves
a request's headers only through its own tenant's rules. The ``default`` kind has one
key, ``default``, so a tenant has at most one default rule. A rule must name an alias
that points at a version when it is written.

Every change writes exactly one ``route_changed`` event (carrying the tenant) in the
same transaction as the change, so an agent hears of it even when NATS was down.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import cast

from sqlalchemy import ColumnElement, Row, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import DEFAULT_ROUTE_KEY, RouteChanged, RouteKind, RouteRule
from registry_service.adapters.lookup import get_visible_adapter
from registry_service.adapters.models import Adapter
from registry_service.aliases.models import Alias
from registry_service.aliases.service import check_alias_name
from registry_service.auth.roles import Principal, Role
from registry_service.db.base import utcnow
from registry_service.errors import BadRequest, InvalidInput, NotFound
from registry_service.events.service import envelope, record_event
from registry_service.routing.models import RouteRuleRow
from registry_service.routing.schemas import RouteList, RouteOut
from registry_service.routing.scope import TenantScope, tenant_scope
from registry_service.tenants.models import Tenant

# Keys arrive in HTTP headers (customer ids, task names), so visible ASCII is enough.
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


def _check_key(kind: RouteKind, key: str) -> None:
    if not _KEY.fullmatch(key):
        raise InvalidInput("a route key must be 1-255 visible ASCII characters",
                           code="invalid_route_key", detail={"key": key[:300]})
    if kind == "default" and key != DEFAULT_ROUTE_KEY:
        raise InvalidInput(f"a tenant has one default rule, whose key is "
                           f"{DEFAULT_ROUTE_KEY!r}: use /v1/routes/default/{DEFAULT_ROUTE_KEY}",
                           code="invalid_route_key", detail={"key": key[:300]})


def _not_found(kind: str, key: str) -> NotFound:
    return NotFound(f"route {kind}/{key} not found", code="route_not_found",
                    detail={"kind": kind, "key": key})


def route_rule(row: RouteRuleRow, adapter: Adapter) -> RouteRule:
    return RouteRule(kind=cast(RouteKind, row.kind), key=row.key, adapter=adapter.name,
                     alias=row.alias, tenant=adapter.tenant.name, base_model=adapter.base_model)


def _out(row: RouteRuleRow, adapter: Adapter) -> RouteOut:
    return RouteOut(**route_rule(row, adapter).model_dump(), updated_at=row.updated_at)


async def _next_revision(session: AsyncSession, tenant_id: int) -> int:
    """The tenant's next rule revision. The UPDATE locks the tenant's row until commit,
    so the tenant's rule changes commit in revision order, without gaps."""
    bumped = await session.scalar(
        update(Tenant).where(Tenant.id == tenant_id)
        .values(route_revision=Tenant.route_revision + 1).returning(Tenant.route_revision))
    if bumped is None:
        raise RuntimeError(f"tenant {tenant_id} vanished under a routing change")
    return int(bumped)


async def _record(session: AsyncSession, adapter: Adapter, *, kind: RouteKind, key: str,
                  rule: RouteRule | None, actor: str) -> None:
    revision = await _next_revision(session, adapter.tenant_id)
    event = RouteChanged(**envelope(adapter.tenant.name, adapter.name), kind=kind, key=key,
                         rule=rule, route_revision=revision)
    record_event(session, event, actor=actor)


async def _check_alias(session: AsyncSession, adapter: Adapter, alias: str) -> None:
    check_alias_name(alias)
    found = await session.scalar(select(Alias.id).where(
        Alias.adapter_id == adapter.id, Alias.name == alias, Alias.version_id.is_not(None)))
    if found is None:
        raise NotFound(f"adapter {adapter.name!r} has no alias {alias!r}",
                       code="alias_not_found", detail={"adapter": adapter.name, "alias": alias})


async def _locked_rule(
    session: AsyncSession, tenant_id: int, kind: str, key: str
) -> tuple[RouteRuleRow, Adapter] | None:
    """The tenant's rule for ``(kind, key)``, locked for this transaction, with its adapter."""
    found = (await session.execute(
        select(RouteRuleRow, Adapter).join(Adapter, Adapter.id == RouteRuleRow.adapter_id)
        .where(RouteRuleRow.tenant_id == tenant_id, RouteRuleRow.kind == kind,
               RouteRuleRow.key == key)
        .with_for_update(of=RouteRuleRow)
    )).first()
    return (found[0], found[1]) if found is not None else None


async def _lock_or_insert(
    session: AsyncSession, *, kind: RouteKind, key: str, target: Adapter, alias: str,
) -> tuple[RouteRuleRow, bool]:
    """The locked rule for the target's ``(tenant, kind, key)``; True if this call made it."""
    existing = await _locked_rule(session, target.tenant_id, kind, key)
    if existing is not None:
        return existing[0], False
    try:
        async with session.begin_nested():
            row = RouteRuleRow(tenant_id=target.tenant_id, kind=kind, key=key,
                               adapter_id=target.id, alias=alias, updated_at=utcnow())
            session.add(row)
        return row, True
    except IntegrityError:
        # A concurrent request created it first; ours becomes a replacement of theirs.
        existing = await _locked_rule(session, target.tenant_id, kind, key)
        if existing is None:
            raise
        return existing[0], False


async def put_route(
    session: AsyncSession, principal: Principal, *, kind: RouteKind, key: str,
    adapter: str, alias: str, tenant: str | None = None,
) -> RouteOut:
    """Create or replace the rule of the adapter's tenant. Re-putting the same target
    changes nothing (no event). ``tenant``, if given, must be the adapter's tenant."""
    principal.require(Role.PUBLISHER)
    _check_key(kind, key)
    check_alias_name(alias)
    scope = await tenant_scope(session, principal, tenant)
    target = await get_visible_adapter(session, principal, adapter)
    if scope.tenant_id is not None and target.tenant_id != scope.tenant_id:
        # Named in another tenant than the one asked for: not there, as far as it knows.
        raise NotFound(f"adapter {adapter!r} not found in tenant {tenant!r}",
                       code="adapter_not_found", detail={"adapter": adapter})
    await _check_alias(session, target, alias)
    rule, created = await _lock_or_insert(session, kind=kind, key=key, target=target,
                                          alias=alias)
    if not created:
        if rule.adapter_id == target.id and rule.alias == alias:
            return _out(rule, target)
        rule.adapter_id, rule.alias, rule.updated_at = target.id, alias, utcnow()
    await _record(session, target, kind=kind, key=key, rule=route_rule(rule, target),
            actor=principal.name)
    await session.commit()
    return _out(rule, target)


async def delete_route(
    session: AsyncSession, principal: Principal, *, kind: RouteKind, key: str,
    tenant: str | None = None,
) -> None:
    principal.require(Role.PUBLISHER)
    scope = await tenant_scope(session, principal, tenant)
    tenant_id = await _rule_tenant(session, scope, kind, key)
    existing = await _locked_rule(session, tenant_id, kind, key)
    if existing is None:
        raise _not_found(kind, key)
    rule, adapter = existing
    await session.delete(rule)
    await _record(session, adapter, kind=kind, key=key, rule=None, actor=principal.name)
    await session.commit()


async def _rule_tenant(session: AsyncSession, scope: TenantScope, kind: str, key: str) -> int:
    """Whose rule ``(kind, key)`` means: the scope's tenant, or for a global token that
    names none, the one tenant holding such a rule (several: the caller must choose)."""
    if scope.tenant_id is not None:
        return scope.tenant_id
    owners = list(await session.scalars(
        select(RouteRuleRow.tenant_id).where(RouteRuleRow.kind == kind, RouteRuleRow.key == key)))
    if not owners:
        raise _not_found(kind, key)
    if len(owners) > 1:
        raise BadRequest(f"several tenants have a rule {kind}/{key}; name one with ?tenant=",
                         code="tenant_required", detail={"kind": kind, "key": key})
    return owners[0]


async def list_routes(
    session: AsyncSession, principal: Principal, *, kind: RouteKind | None = None,
    tenant: str | None = None,
) -> RouteList:
    principal.require(Role.READER)
    scope = await tenant_scope(session, principal, tenant, missing_ok=True)
    where: list[ColumnElement[bool]] = []
    if scope.tenant_id is not None:
        where.append(RouteRuleRow.tenant_id == scope.tenant_id)
    if kind is not None:
        where.append(RouteRuleRow.kind == kind)
    if scope.empty:
        return RouteList(routes=[])
    return RouteList(routes=[_out(rule, adapter) for rule, adapter in await _rules(session, where)])


async def _rules(
    session: AsyncSession, where: Sequence[ColumnElement[bool]]
) -> Sequence[Row[RouteRuleRow, Adapter]]:
    query = (select(RouteRuleRow, Adapter).join(Adapter, Adapter.id == RouteRuleRow.adapter_id)
             .where(*where).order_by(RouteRuleRow.kind, RouteRuleRow.key, Adapter.name))
    return (await session.execute(query)).all()


async def route_revisions(session: AsyncSession, tenant_id: int | None) -> dict[str, int]:
    """tenant -> its rule revision (every tenant, or the one given)."""
    query = select(Tenant.name, Tenant.route_revision)
    if tenant_id is not None:
        query = query.where(Tenant.id == tenant_id)
    return {name: int(revision) for name, revision in (await session.execute(query)).all()}


async def rules_to(session: AsyncSession, where: Sequence[ColumnElement[bool]]) -> list[RouteRule]:
    """The rules naming the adapters that match ``where`` (conditions on ``Adapter``)."""
    return [route_rule(rule, adapter) for rule, adapter in await _rules(session, where)]


async def drop_routes_to(session: AsyncSession, adapter: Adapter, *, actor: str) -> None:
    """Delete every rule naming ``adapter``, one event each. Never commits."""
    rules = await session.scalars(select(RouteRuleRow).where(RouteRuleRow.adapter_id == adapter.id))
    for rule in list(rules):
        await _record(session, adapter, kind=cast(RouteKind, rule.kind), key=rule.key, rule=None,
                actor=actor)
        await session.delete(rule)
