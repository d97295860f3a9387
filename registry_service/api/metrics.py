"""Prometheus metrics of the registry, one CollectorRegistry per app instance."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.requests import Request
from starlette.responses import Response


class RegistryMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "loraplane_registry_requests_total", "HTTP requests",
            ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram(
            "loraplane_registry_request_seconds", "HTTP request latency",
            ["method", "route"], registry=self.registry)
        self.upload_bytes = Counter(
            "loraplane_registry_upload_bytes_total", "Bytes received in version uploads",
            registry=self.registry)
        self.versions_created = Counter(
            "loraplane_registry_versions_created_total", "New versions stored",
            registry=self.registry)
        self.uploads_refused = Counter(
            "loraplane_registry_uploads_refused_total", "Uploads refused, by reason",
            ["code"], registry=self.registry)
        self.events_published = Counter(
            "loraplane_registry_events_published_total", "Outbox rows published to NATS",
            registry=self.registry)
        self.outbox_pending = Gauge(
            "loraplane_registry_outbox_pending", "Outbox rows not yet published",
            registry=self.registry)
        self.relay_errors = Counter(
            "loraplane_registry_relay_errors_total", "Failed publish attempts",
            registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


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
