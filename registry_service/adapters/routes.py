from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from registry_service.adapters import service
from registry_service.adapters.schemas import (
    AdapterCreate,
    AdapterOut,
    AdapterPage,
    AdapterUpdate,
)
from registry_service.deps import PrincipalDep, SessionDep

router = APIRouter(prefix="/v1/adapters", tags=["adapters"])


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_adapter(body: AdapterCreate, session: SessionDep,
                         principal: PrincipalDep) -> AdapterOut:
    return await service.create_adapter(session, principal, body)


@router.get("")
async def list_adapters(
    session: SessionDep, principal: PrincipalDep,
    tenant: str | None = None, base_model: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100, cursor: str | None = None,
) -> AdapterPage:
    return await service.list_adapters(session, principal, tenant=tenant,
                                       base_model=base_model, limit=limit, cursor=cursor)


@router.get("/{name}")
async def get_adapter(name: str, session: SessionDep, principal: PrincipalDep) -> AdapterOut:
    return await service.show_adapter(session, principal, name)


@router.patch("/{name}")
async def update_adapter(name: str, body: AdapterUpdate, session: SessionDep,
                         principal: PrincipalDep) -> AdapterOut:
    """Change the placement (``replicas``) or the description; only the fields sent."""
    return await service.update_adapter(session, principal, name, body)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_adapter(name: str, session: SessionDep, principal: PrincipalDep) -> Response:
    await service.delete_adapter(session, principal, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# Names are global; a deleted adapter's name stays retired until a global admin frees it.
retired_names = APIRouter(prefix="/v1/retired-names", tags=["adapters"])


@retired_names.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
async def free_retired_name(name: str, session: SessionDep, principal: PrincipalDep) -> Response:
    """Free a deleted adapter's retired name, so that any tenant may create it again."""
    await service.free_retired_name(session, principal, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
