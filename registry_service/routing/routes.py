from __future__ import annotations

from fastapi import APIRouter, Response, status

from loraplane.events import RouteKind
from registry_service.deps import PrincipalDep, SessionDep
from registry_service.routing import service
from registry_service.routing.schemas import RouteList, RouteOut, RoutePut

router = APIRouter(prefix="/v1/routes", tags=["routing"])


@router.get("")
async def list_routes(session: SessionDep, principal: PrincipalDep,
                      kind: RouteKind | None = None) -> RouteList:
    return await service.list_routes(session, principal, kind=kind)


@router.put("/{kind}/{key}")
async def put_route(kind: RouteKind, key: str, body: RoutePut, session: SessionDep,
                    principal: PrincipalDep) -> RouteOut:
    return await service.put_route(session, principal, kind=kind, key=key,
                                   adapter=body.adapter, alias=body.alias)


@router.delete("/{kind}/{key}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_route(kind: RouteKind, key: str, session: SessionDep,
                       principal: PrincipalDep) -> Response:
    await service.delete_route(session, principal, kind=kind, key=key)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
