"""Routing rules: a customer, a task or a default names ``adapter@alias``.

The agents resolve request headers through these rules. Every change writes exactly
one ``route_changed`` event in the same transaction as the change, so an agent hears of
it even when NATS was down at the time. The ``(kind, key)`` namespace is shared by all
tenants; a rule belongs to the tenant of the adapter it points at.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import cast

from sqlalchemy import ColumnElement, Row, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import RouteChanged, RouteKind, RouteRule
from registry_service.adapters.lookup import get_visible_adapter
from registry_service.adapters.models import Adapter
from registry_service.aliases.service import check_alias_name
from registry_service.auth.roles import Principal, Role
from registry_service.db.base import utcnow
from registry_service.errors import InvalidInput, NotFound
from registry_service.events.service import envelope, record_event
from registry_service.routing.models import RouteRuleRow
from registry_service.routing.schemas import RouteList, RouteOut

# Keys arrive in HTTP headers (customer ids, task names), so visible ASCII is enough.
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


def _check_key(key: str) -> None:
    if not _KEY.fullmatch(key):
        raise InvalidInput("a route key must be 1-255 visible ASCII characters",
                           code="invalid_route_key", detail={"key": key[:300]})


def _not_found(kind: str, key: str) -> NotFound:
    return NotFound(f"route {kind}/{key} not found", code="route_not_found",
                    detail={"kind": kind, "key": key})


def route_rule(row: RouteRuleRow, adapter: Adapter) -> RouteRule:
    return RouteRule(kind=cast(RouteKind, row.kind), key=row.key, adapter=adapter.name,
                     alias=row.alias, tenant=adapter.tenant.name, base_model=adapter.base_model)


def _out(row: RouteRuleRow, adapter: Adapter) -> RouteOut:
    return RouteOut(**route_rule(row, adapter).model_dump(), updated_at=row.updated_at)


def _record(session: AsyncSession, adapter: Adapter, *, kind: RouteKind, key: str,
            rule: RouteRule | None, actor: str) -> None:
    event = RouteChanged(**envelope(adapter.tenant.name, adapter.name), kind=kind, key=key,
                         rule=rule)
    record_event(session, event, actor=actor)


async def _locked_rule(
    session: AsyncSession, principal: Principal, kind: str, key: str
) -> tuple[RouteRuleRow, Adapter] | None:
    """The rule for ``(kind, key)``, locked for this transaction, with its adapter.

    A rule pointing at another tenant's adapter answers 404, so a tenant can neither
    read nor take over another tenant's route.
    """
    rule = await session.scalar(
        select(RouteRuleRow).where(RouteRuleRow.kind == kind, RouteRuleRow.key == key)
        .with_for_update()
    )
    if rule is None:
        return None
    adapter = await session.get(Adapter, rule.adapter_id)
    if adapter is None or not principal.can_see(adapter.tenant_id):
        raise _not_found(kind, key)
    return rule, adapter


async def _lock_or_insert(
    session: AsyncSession, principal: Principal, *, kind: RouteKind, key: str,
    target: Adapter, alias: str,
) -> tuple[RouteRuleRow, bool]:
    """The locked rule for ``(kind, key)`` and whether this call created it."""
    existing = await _locked_rule(session, principal, kind, key)
    if existing is not None:
        return existing[0], False
    try:
        async with session.begin_nested():
            row = RouteRuleRow(kind=kind, key=key, adapter_id=target.id, alias=alias,
                               updated_at=utcnow())
            session.add(row)
        return row, True
    except IntegrityError:
        # A concurrent request created it first; ours becomes a replacement of theirs.
        existing = await _locked_rule(session, principal, kind, key)
        if existing is None:
            raise
        return existing[0], False


async def put_route(
    session: AsyncSession, principal: Principal, *, kind: RouteKind, key: str,
    adapter: str, alias: str,
) -> RouteOut:
    """Create or replace a rule. Re-putting the same target changes nothing (no event)."""
    principal.require(Role.PUBLISHER)
    _check_key(key)
    check_alias_name(alias)
    target = await get_visible_adapter(session, principal, adapter)
    rule, created = await _lock_or_insert(session, principal, kind=kind, key=key,
                                          target=target, alias=alias)
    if not created:
        if rule.adapter_id == target.id and rule.alias == alias:
            return _out(rule, target)
        rule.adapter_id, rule.alias, rule.updated_at = target.id, alias, utcnow()
    _record(session, target, kind=kind, key=key, rule=route_rule(rule, target),
            actor=principal.name)
    await session.commit()
    return _out(rule, target)


async def delete_route(
    session: AsyncSession, principal: Principal, *, kind: RouteKind, key: str
) -> None:
    principal.require(Role.PUBLISHER)
    existing = await _locked_rule(session, principal, kind, key)
    if existing is None:
        raise _not_found(kind, key)
    rule, adapter = existing
    await session.delete(rule)
    _record(session, adapter, kind=kind, key=key, rule=None, actor=principal.name)
    await session.commit()


async def list_routes(
    session: AsyncSession, principal: Principal, *, kind: RouteKind | None = None
) -> RouteList:
    principal.require(Role.READER)
    where: list[ColumnElement[bool]] = []
    if not principal.is_global:
        where.append(Adapter.tenant_id == principal.tenant_id)
    if kind is not None:
        where.append(RouteRuleRow.kind == kind)
    return RouteList(routes=[_out(rule, adapter) for rule, adapter in await _rules(session, where)])


async def _rules(
    session: AsyncSession, where: Sequence[ColumnElement[bool]]
) -> Sequence[Row[RouteRuleRow, Adapter]]:
    query = (select(RouteRuleRow, Adapter).join(Adapter, Adapter.id == RouteRuleRow.adapter_id)
             .where(*where).order_by(RouteRuleRow.kind, RouteRuleRow.key))
    return (await session.execute(query)).all()


async def rules_to(session: AsyncSession, where: Sequence[ColumnElement[bool]]) -> list[RouteRule]:
    """The rules naming the adapters that match ``where`` (conditions on ``Adapter``)."""
    return [route_rule(rule, adapter) for rule, adapter in await _rules(session, where)]


async def drop_routes_to(session: AsyncSession, adapter: Adapter, *, actor: str) -> None:
    """Delete every rule naming ``adapter``, one event each. Never commits."""
    rules = await session.scalars(select(RouteRuleRow).where(RouteRuleRow.adapter_id == adapter.id))
    for rule in list(rules):
        _record(session, adapter, kind=cast(RouteKind, rule.kind), key=rule.key, rule=None,
                actor=actor)
        await session.delete(rule)
