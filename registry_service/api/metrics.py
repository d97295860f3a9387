"""The middleware that counts and times every HTTP request."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from registry_service.metrics import RegistryMetrics


def _route_template(request: Request) -> str:
    # The router records the route it matched in the scope (routers included by
    # FastAPI are not plain routes, so walking app.router.routes finds no template).
    route = request.scope.get("route")
    return str(getattr(route, "path", "unmatched")) if route is not None else "unmatched"


def metrics_middleware(
    metrics: RegistryMetrics,
) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    async def middleware(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        start = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            route = _route_template(request)
            metrics.requests.labels(request.method, route, str(status)).inc()
            metrics.latency.labels(request.method, route).observe(time.perf_counter() - start)

    return middleware
