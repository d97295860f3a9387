"""Per-request bookkeeping of the proxy: what serves a request, its lease, its metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from inference_agent.metrics import AgentMetrics
from inference_agent.serving.leases import Lease
from inference_agent.serving.routes import Target

ADAPTER_HEADER = "X-Loraplane-Adapter"
# Metric label of a request refused before it was resolved. Not a slug, so it cannot
# collide with an adapter's name, and client-chosen names never become label values.
UNRESOLVED_LABEL = "_unresolved"


@dataclass
class ProxyCall:
    """One proxied request: what serves it, its lease, and its metrics; closed once."""

    metrics: AgentMetrics
    started: float = field(default_factory=time.perf_counter)
    label: str = UNRESOLVED_LABEL
    served: str | None = None
    lease: Lease | None = None
    closed: bool = False

    def bind(self, target: Target, lease: Lease | None) -> None:
        self.label = target.adapter or target.model_name
        self.served = target.model_name
        self.lease = lease

    def headers(self) -> dict[str, str]:
        return {ADAPTER_HEADER: self.served} if self.served is not None else {}

    def done(self, status: int, reason: str | None) -> None:
        """Release the lease and record the request; later calls do nothing."""
        if self.closed:
            return
        self.closed = True
        if self.lease is not None:
            self.lease.release()
        elapsed = time.perf_counter() - self.started
        self.metrics.requests.labels(adapter=self.label, status=str(status)).inc()
        self.metrics.request_latency.labels(adapter=self.label).observe(elapsed)
        if reason is not None:
            self.metrics.request_errors.labels(adapter=self.label, reason=reason).inc()
