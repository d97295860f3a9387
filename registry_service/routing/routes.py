"""``/v1/routes``: list, set and delete a tenant's routing rules, each route one call of
``service``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from loraplane.events import RouteKind
from registry_service.deps import PrincipalDep, SessionDep
from registry_service.routing import service
from registry_service.routing.schemas import RouteList, RouteOut, RoutePut

router = APIRouter(prefix="/v1/routes", tags=["routing"])

TenantParam = Annotated[str | None, Query(
    min_length=1, max_length=63,
    description="whose rules: a tenant token's own by default (no other may be named); "
                "a global token names one where the key alone is ambiguous")]


@router.get("", summary="List routing rules")
async def list_routes(session: SessionDep, principal: PrincipalDep,
                      kind: RouteKind | None = None, tenant: TenantParam = None) -> RouteList:
    """The routing rules of the token's tenant (a global token: every tenant's, unless `tenant`
    names one), optionally of one `kind`."""
    return await service.list_routes(session, principal, kind=kind, tenant=tenant)


@router.put("/{kind}/{key}", summary="Set a routing rule")
async def put_route(kind: RouteKind, key: str, body: RoutePut, session: SessionDep,
                    principal: PrincipalDep, tenant: TenantParam = None) -> RouteOut:
    """Route requests with this customer or task key (or the tenant's `default`) to
    `adapter@alias` (publisher on the adapter's tenant). The alias must point at a version (404
    `alias_not_found`)."""
    return await service.put_route(session, principal, kind=kind, key=key,
                                   adapter=body.adapter, alias=body.alias, tenant=tenant)


@router.delete("/{kind}/{key}", summary="Delete a routing rule",
               status_code=status.HTTP_204_NO_CONTENT)
async def delete_route(kind: RouteKind, key: str, session: SessionDep,
                       principal: PrincipalDep, tenant: TenantParam = None) -> Response:
    """Delete the rule of this kind and key (publisher). A global token names the `tenant` when
    several tenants hold the key (400 `tenant_required`)."""
    await service.delete_route(session, principal, kind=kind, key=key, tenant=tenant)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
