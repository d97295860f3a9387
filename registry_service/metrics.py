"""Prometheus metrics of the registry, one CollectorRegistry per app instance.

They live below the HTTP layer so the relay and the use cases can count without
importing it; ``api/metrics.py`` times requests and ``api/health.py`` serves ``/metrics``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


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
