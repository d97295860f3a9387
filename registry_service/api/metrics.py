"""The middleware that counts and times every HTTP request."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from registry_service.metrics import RegistryMetrics


def _route_template(scope: Scope) -> str:
    # The router records the route it matched in the scope (routers included by
    # FastAPI are not plain routes, so walking app.router.routes finds no template).
    route = scope.get("route")
    return str(getattr(route, "path", "unmatched")) if route is not None else "unmatched"


class MetricsMiddleware:
    """Counts every HTTP request by its status and times it to the start of its response.

    Plain ASGI, not Starlette's ``BaseHTTPMiddleware``: that one passes a request body
    through an anyio stream chunk by chunk, a cost on the event loop for every chunk of a
    large upload.
    """

    def __init__(self, app: ASGIApp, metrics: RegistryMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        recorded = False

        def record(status: int) -> None:
            nonlocal recorded
            if not recorded:
                recorded = True
                route, method = _route_template(scope), scope["method"]
                self.metrics.requests.labels(method, route, str(status)).inc()
                self.metrics.latency.labels(method, route).observe(time.perf_counter() - start)

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                record(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, counted)
        finally:
            record(500)  # no response started: the server error handler answers 500
