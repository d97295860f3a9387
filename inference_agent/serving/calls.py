"""Per-request bookkeeping of the proxy: what serves a request, its lease, its metrics,
and, for an alias under canary, its side's counts (traffic.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from inference_agent.metrics import AgentMetrics
from inference_agent.serving.leases import Lease
from inference_agent.serving.routes import CanarySide, Target
from inference_agent.serving.traffic import TrafficTally

ADAPTER_HEADER = "X-Loraplane-Adapter"
# Metric label of a request refused before it was resolved. Not a slug, so it cannot
# collide with an adapter's name, and client-chosen names never become label values.
UNRESOLVED_LABEL = "_unresolved"
# An SSE event is far shorter; a longer unterminated tail is not an event worth parsing.
_MAX_PARTIAL = 1024 * 1024


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


@dataclass
class ProxyCall:
    """One proxied request: what serves it, its lease, and its metrics; closed once.
    ``track`` is the metrics' label of its canary side ("" when not under a canary)."""

    metrics: AgentMetrics
    tally: TrafficTally | None = None
    started: float = field(default_factory=time.perf_counter)
    label: str = UNRESOLVED_LABEL
    side: CanarySide | None = None
    track: str = ""
    served: str | None = None
    lease: Lease | None = None
    closed: bool = False
    first_chunk_seen: bool = False
    # The end of a streamed body not yet followed by a newline (an SSE line cut in two).
    partial_line: bytes = b""

    def bind(self, target: Target, lease: Lease | None) -> None:
        self.label = self.metrics.adapter(target.adapter or target.model_name)
        self.served = target.model_name
        self.lease = lease
        self.side = target.canary
        self.track = target.canary[1] if target.canary is not None else ""

    def headers(self) -> dict[str, str]:
        return {ADAPTER_HEADER: self.served} if self.served is not None else {}

    def chunk(self, data: bytes) -> None:
        """A streamed body chunk passed back: time to the first one, tokens of the last
        (vLLM sends ``usage`` in a final event when asked with ``stream_options``)."""
        if not self.first_chunk_seen:
            self.first_chunk_seen = True
            elapsed = time.perf_counter() - self.started
            self.metrics.child(self.metrics.first_token, self.label, self.track).observe(
                elapsed)
            if self.side is not None and self.tally is not None:
                self.tally.first_token(self.side, elapsed)
        lines = (self.partial_line + data).split(b"\n")
        self.partial_line = lines.pop()[-_MAX_PARTIAL:]
        for line in lines:
            if line.startswith(b"data: {") and b'"usage"' in line:
                self._usage(_json(line.removeprefix(b"data: ")))

    def body(self, content: bytes) -> None:
        """A whole (not streamed) response body: count the tokens its ``usage`` gives."""
        if b'"usage"' in content:
            self._usage(_json(content))

    def _usage(self, payload: Any) -> None:
        usage = payload.get("usage") if isinstance(payload, dict) else None
        if isinstance(usage, dict):
            self.metrics.count_tokens(self.label, usage)

    def done(self, status: int, reason: str | None) -> None:
        """Release the lease and record the request; later calls do nothing."""
        if self.closed:
            return
        self.closed = True
        if self.lease is not None:
            self.lease.release()
        elapsed = time.perf_counter() - self.started
        metrics = self.metrics
        metrics.child(metrics.requests, self.label, str(status), self.track).inc()
        metrics.child(metrics.request_latency, self.label, self.track).observe(elapsed)
        if reason is not None:
            metrics.child(metrics.request_errors, self.label, reason).inc()
        if self.side is not None and self.tally is not None:
            self.tally.record(self.side, status, elapsed)
