"""Prometheus metrics of the registry, one CollectorRegistry per app instance.

They live below the HTTP layer so the relay and the use cases can count without
importing it; ``api/metrics.py`` times requests and ``api/health.py`` serves ``/metrics``
(refreshing the fleet's gauges from the database first). docs/metrics.md lists them all.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from loraplane.metric_labels import DEFAULT_MAX_ADAPTER_LABELS, AdapterLabels

# An upload's phases, in order, as ``upload_phase_seconds`` labels them.
UPLOAD_PHASES = ("admit", "receive", "validate", "lease", "store", "commit")

_PUBLISH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0)

# A collector pass lists the whole store: seconds for a small one, an hour for millions.
_PASS_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


@dataclass(frozen=True, slots=True)
class AliasConvergence:
    """One alias across the fleet: fresh agents that should serve its version, those
    that do, and those that reported failing it."""

    adapter: str
    alias: str
    expected: int
    converged: int
    failed: int


@dataclass(frozen=True, slots=True)
class CanaryGauges:
    """A running canary as its gauges show it."""

    adapter: str
    alias: str
    state: str
    step: int
    weight: int
    paused_s: float
    values: list[tuple[str, str, float]]  # (metric, side, value) of its last checks


class RegistryMetrics:
    def __init__(self, max_adapters: int = DEFAULT_MAX_ADAPTER_LABELS) -> None:
        self.adapter = AdapterLabels(max_adapters)
        self.registry = CollectorRegistry()
        # Held while gauges are replaced and while the metrics are written, both on
        # worker threads: a scrape never sees gauges cleared and not yet set again.
        self.lock = threading.Lock()
        self._http()
        self._uploads()
        self._outbox()
        self._fleet()
        self._blob_gc()
        self._canaries()

    def _http(self) -> None:
        self.requests = Counter(
            "loraplane_registry_requests_total", "HTTP requests",
            ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram(
            "loraplane_registry_request_seconds", "HTTP request latency",
            ["method", "route"], registry=self.registry)

    def _uploads(self) -> None:
        self.uploads = Counter(
            "loraplane_registry_uploads_total",
            "Version uploads by outcome: created, unchanged (same content) or refused",
            ["outcome"], registry=self.registry)
        self.upload_bytes = Counter(
            "loraplane_registry_upload_bytes_total", "Bytes received in version uploads",
            registry=self.registry)
        self.versions_created = Counter(
            "loraplane_registry_versions_created_total", "New versions stored",
            registry=self.registry)
        self.uploads_refused = Counter(
            "loraplane_registry_uploads_refused_total", "Uploads refused, by reason",
            ["code"], registry=self.registry)
        # Where an upload's time goes, so that a slow push can be split on a live registry.
        self.upload_phase = Histogram(
            "loraplane_registry_upload_phase_seconds",
            "Time an upload spends in each phase: admit (caller and adapter checked), "
            "receive (body streamed in), validate, lease (blob leases taken), store "
            "(blobs stored), commit (version, event and alias moves)",
            ["phase"], buckets=_PUBLISH_BUCKETS, registry=self.registry)

    def _outbox(self) -> None:
        self.events_published = Counter(
            "loraplane_registry_events_published_total", "Outbox rows published to NATS",
            registry=self.registry)
        self.outbox_pending = Gauge(
            "loraplane_registry_outbox_pending", "Outbox rows not yet published",
            registry=self.registry)
        self._oldest_pending: datetime | None = None
        self.outbox_oldest_age = Gauge(
            "loraplane_registry_outbox_oldest_age_seconds",
            "Age of the oldest unpublished outbox row at scrape time (0 when none)",
            registry=self.registry)
        # Computed as it is scraped: a stuck relay stops counting, the age still grows.
        self.outbox_oldest_age.set_function(self._oldest_age)
        self.relay_errors = Counter(
            "loraplane_registry_relay_errors_total", "Failed publish attempts",
            registry=self.registry)
        self.relay_publish = Histogram(
            "loraplane_registry_relay_publish_seconds",
            "Publishing one outbox row to NATS until its acknowledgement",
            buckets=_PUBLISH_BUCKETS, registry=self.registry)

    def _fleet(self) -> None:
        labels = ["adapter", "alias"]
        self.alias_expected = Gauge(
            "loraplane_registry_alias_agents_expected",
            "Fresh agents of the adapter's base model, which should serve the alias's version",
            labels, registry=self.registry)
        self.alias_converged = Gauge(
            "loraplane_registry_alias_agents_converged",
            "Fresh agents that report serving the alias's version", labels,
            registry=self.registry)
        self.alias_failed = Gauge(
            "loraplane_registry_alias_agents_failed",
            "Fresh agents that report failing the alias's version", labels,
            registry=self.registry)
        self.report_batch = Histogram(
            "loraplane_registry_report_batch_size",
            "Agents' status reports stored in one transaction (those that arrived while "
            "the batch before was written)",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=self.registry)
        self.agent_last_report = Gauge(
            "loraplane_registry_agent_last_report_timestamp_seconds",
            "When each agent last reported its status (Unix time)", ["agent"],
            registry=self.registry)

    def _blob_gc(self) -> None:
        self.blob_gc_running = Gauge(
            "loraplane_registry_blob_gc_running",
            "Blob collector passes running now (1 while a pass runs)",
            registry=self.registry)
        self.blob_gc_examined = Counter(
            "loraplane_registry_blob_gc_blobs_examined_total",
            "Stored blobs the collector has examined, counted page by page as a pass goes",
            registry=self.registry)
        self.blob_gc_deleted = Counter(
            "loraplane_registry_blob_gc_deleted_total",
            "Unreferenced blobs the collector deleted", registry=self.registry)
        self.blob_gc_pass = Histogram(
            "loraplane_registry_blob_gc_pass_seconds",
            "How long one collector pass took, from the store's listing to its last delete",
            buckets=_PASS_BUCKETS, registry=self.registry)

    def _canaries(self) -> None:
        labels = ["adapter", "alias"]
        r = self.registry
        self.canary_state = Gauge(
            "loraplane_registry_canary_state", "Running canaries: 1 for the state each is in "
            "(progressing or paused)", [*labels, "state"], registry=r)
        self.canary_step = Gauge("loraplane_registry_canary_step",
                                 "A running canary's step (1-based)", labels, registry=r)
        self.canary_weight = Gauge("loraplane_registry_canary_weight_percent",
                                   "A running canary's share of its alias's traffic",
                                   labels, registry=r)
        self.canary_paused = Gauge(
            "loraplane_registry_canary_paused_seconds",
            "How long a running canary has been paused (0 while progressing)", labels,
            registry=r)
        self.canary_check = Gauge(
            "loraplane_registry_canary_check_value",
            "A running canary's last judged step: each check's value on each side "
            "(stable, canary)", [*labels, "metric", "side"], registry=r)
        self.canary_rolled_back = Gauge(
            "loraplane_registry_canary_rolled_back_timestamp_seconds",
            "When the analysis last rolled back a canary of the alias (Unix time; the last "
            "day's)", labels, registry=r)
        self.canary_judged = Counter(
            "loraplane_registry_canary_steps_judged_total",
            "Canary steps this process judged, by outcome: advance, promote, retry, "
            "extend, rollback, pause", ["outcome"], registry=r)
        for outcome in ("advance", "promote", "retry", "extend", "rollback", "pause"):
            self.canary_judged.labels(outcome)

    def count_judged(self, outcome: str) -> None:
        """Count a step the canary analyst judged."""
        self.canary_judged.labels(outcome).inc()

    def set_canaries(self, running: Iterable[CanaryGauges],
                     rolled_back: Iterable[tuple[str, str, datetime]]) -> None:
        """Replace the canaries' gauges (the caller holds ``lock``)."""
        for gauge in (self.canary_state, self.canary_step, self.canary_weight,
                      self.canary_paused, self.canary_check, self.canary_rolled_back):
            gauge.clear()
        for c in running:
            at = (self.adapter(c.adapter), c.alias)
            self.canary_state.labels(*at, c.state).set(1)
            self.canary_step.labels(*at).set(c.step)
            self.canary_weight.labels(*at).set(c.weight)
            self.canary_paused.labels(*at).set(c.paused_s)
            for metric, side, value in c.values:
                self.canary_check.labels(*at, metric, side).set(value)
        for adapter, alias, when in rolled_back:
            self.canary_rolled_back.labels(self.adapter(adapter), alias).set(when.timestamp())

    def set_outbox(self, pending: int, oldest: datetime | None) -> None:
        self.outbox_pending.set(pending)
        self._oldest_pending = oldest

    def _oldest_age(self) -> float:
        oldest = self._oldest_pending
        if oldest is None:
            return 0.0
        if oldest.tzinfo is None:  # the database keeps UTC
            oldest = oldest.replace(tzinfo=UTC)
        return max(0.0, (datetime.now(UTC) - oldest).total_seconds())

    def set_fleet(self, aliases: Iterable[AliasConvergence],
                  last_reports: dict[str, datetime]) -> None:
        """Replace the fleet's gauges; folded adapters (``_other``) are summed."""
        totals: dict[tuple[str, str], list[int]] = {}
        for a in aliases:
            row = totals.setdefault((self.adapter(a.adapter), a.alias), [0, 0, 0])
            row[0] += a.expected
            row[1] += a.converged
            row[2] += a.failed
        for gauge in (self.alias_expected, self.alias_converged, self.alias_failed,
                      self.agent_last_report):
            gauge.clear()
        for (adapter, alias), (expected, converged, failed) in totals.items():
            self.alias_expected.labels(adapter, alias).set(expected)
            self.alias_converged.labels(adapter, alias).set(converged)
            self.alias_failed.labels(adapter, alias).set(failed)
        for agent, seen in last_reports.items():
            self.agent_last_report.labels(agent).set(seen.timestamp())

    def render(self) -> bytes:
        return generate_latest(self.registry)
