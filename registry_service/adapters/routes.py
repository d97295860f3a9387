"""``/v1/adapters``: create, list, show, update and delete adapters, each route one call of
``service``."""

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


@router.post("", summary="Create an adapter", status_code=status.HTTP_201_CREATED)
async def create_adapter(body: AdapterCreate, session: SessionDep,
                         principal: PrincipalDep) -> AdapterOut:
    """Register a name for a tenant and a base model (publisher). Names are global: one taken by
    any tenant, or retired, answers 409 `adapter_name_taken`. A global token names the `tenant`,
    created with its first adapter."""
    return await service.create_adapter(session, principal, body)


@router.get("", summary="List adapters")
async def list_adapters(
    session: SessionDep, principal: PrincipalDep,
    tenant: str | None = None, base_model: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100, cursor: str | None = None,
) -> AdapterPage:
    """The adapters the token may read, by name, `limit` at a time; filter by `tenant` or
    `base_model`; pass the page's `next_cursor` as `cursor` for the next page."""
    return await service.list_adapters(session, principal, tenant=tenant,
                                       base_model=base_model, limit=limit, cursor=cursor)


@router.get("/{name}", summary="Show an adapter")
async def get_adapter(name: str, session: SessionDep, principal: PrincipalDep) -> AdapterOut:
    """One adapter with its aliases and the versions they point at (reader). Another tenant's
    adapter answers 404, as an unknown one does."""
    return await service.show_adapter(session, principal, name)


@router.patch("/{name}", summary="Change an adapter")
async def update_adapter(name: str, body: AdapterUpdate, session: SessionDep,
                         principal: PrincipalDep) -> AdapterOut:
    """Change the placement (``replicas``) or the description; only the fields sent."""
    return await service.update_adapter(session, principal, name, body)


@router.delete("/{name}", summary="Delete an adapter", status_code=status.HTTP_204_NO_CONTENT)
async def delete_adapter(name: str, session: SessionDep, principal: PrincipalDep) -> Response:
    """Delete the adapter and its aliases and routing rules (admin). Its versions stay in the
    history, and its name is retired: it cannot be created again until a global admin frees it."""
    await service.delete_adapter(session, principal, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# Names are global; a deleted adapter's name stays retired until a global admin frees it.
retired_names = APIRouter(prefix="/v1/retired-names", tags=["adapters"])


@retired_names.delete("/{name}", summary="Free a retired name",
                      status_code=status.HTTP_204_NO_CONTENT)
async def free_retired_name(name: str, session: SessionDep, principal: PrincipalDep) -> Response:
    """Free a deleted adapter's retired name, so that any tenant may create it again."""
    await service.free_retired_name(session, principal, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
