"""No route or dependency of the registry runs in FastAPI's thread pool.

FastAPI runs a plain ``def`` dependency or endpoint in a worker thread: a hand-off to a
thread and back on every request, a few percent of a status report's CPU (seen in
py-spy profiles of status reports). Everything it calls is async instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from registry_service.app import create_app
from registry_service.settings import RegistrySettings


def _api_routes(routes: list[BaseRoute]) -> Iterator[APIRoute]:
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        # An included router keeps its own routes (fastapi's _IncludedRouter).
        inner = getattr(route, "original_router", route)
        yield from _api_routes(getattr(inner, "routes", []))


def _callables(dependant: Dependant) -> Iterator[object]:
    if dependant.call is not None:
        yield dependant.call
    for sub in dependant.dependencies:
        yield from _callables(sub)


def _is_async(call: object) -> bool:
    # A dependency may be an instance whose __call__ is async (HTTPBearer).
    target = call if inspect.isfunction(call) or inspect.ismethod(call) else \
        getattr(call, "__call__", call)  # noqa: B004
    return inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target)


def test_every_endpoint_and_dependency_is_async(tmp_path: Path) -> None:
    settings = RegistrySettings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'r.db'}",
                                blob_dir=tmp_path / "blobs")
    routes = list(_api_routes(create_app(settings).routes))
    assert len(routes) > 20
    sync = sorted({f"{route.path}: {getattr(call, '__qualname__', call)}"
                   for route in routes for call in _callables(route.dependant)
                   if not _is_async(call)})
    assert sync == []
