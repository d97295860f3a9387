"""Every Prometheus metric of the agent, in one object with its own registry.

A registry per agent (not the process-global one) keeps tests and several agents in
one process from colliding on metric names. Every ``adapter`` label value goes through
``self.adapter`` (``AdapterLabels``): at most ``max_adapters`` names, the rest ``_other``.
docs/metrics.md lists them all.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from inference_agent.errors import AgentError
from loraplane.events import TRAFFIC_BUCKETS
from loraplane.metric_labels import DEFAULT_MAX_ADAPTER_LABELS, AdapterLabels

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STAGES = ("desired", "fetch", "validate", "load", "flip", "drain", "unload")
# The canaries' traffic reports count in the same buckets (loraplane/events.py).
_LATENCY_BUCKETS = TRAFFIC_BUCKETS
_STAGE_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0,
                  300.0, 900.0)
# 1 s is the design's load-time alert threshold: a bucket edge there keeps it exact.
_LOAD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
M = TypeVar("M", bound=MetricWrapperBase)
# The agent's loop-lag histogram: the agent's monitor (loraplane/loop_lag.py) registers
# it in ``AgentMetrics.registry`` when the agent is built.
LOOP_LAG_METRIC = "loraplane_agent_event_loop_lag_seconds"


def process_rss_bytes(status: Path = Path("/proc/self/status")) -> int | None:
    """Resident set size from /proc (Linux); None where there is no /proc."""
    try:
        text = status.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    return None


class AgentMetrics:
    """The agent's metrics; ``render`` gives the exposition text for ``/metrics``."""

    def __init__(self, max_adapters: int = DEFAULT_MAX_ADAPTER_LABELS) -> None:
        self.adapter = AdapterLabels(max_adapters)
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._requests()
        self._cache()
        self._control()
        self.process_memory = Gauge("loraplane_agent_process_resident_memory_bytes",
                                    "Resident memory of the agent process",
                                    registry=self.registry)
        self.process_memory.set_function(lambda: float(process_rss_bytes() or 0))

    def _requests(self) -> None:
        r = self.registry
        # ``track``: "stable" or "canary" for a request of an alias under canary (the
        # side its split chose), "" for every other request (no label in Prometheus).
        self.requests = Counter("loraplane_agent_requests", "Proxied requests",
                                ["adapter", "status", "track"], registry=r)
        self.request_errors = Counter("loraplane_agent_request_errors",
                                      "Proxied requests that failed", ["adapter", "reason"],
                                      registry=r)
        self.request_latency = Histogram("loraplane_agent_request_seconds",
                                         "Proxied request latency (to the last byte)",
                                         ["adapter", "track"], buckets=_LATENCY_BUCKETS,
                                         registry=r)
        self.first_token = Histogram("loraplane_agent_time_to_first_token_seconds",
                                     "Streamed requests: from arrival to the first body "
                                     "chunk from vLLM", ["adapter", "track"],
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("loraplane_agent_tokens", "Tokens vLLM reported in `usage`, "
                              "by kind (prompt or completion)", ["adapter", "kind"],
                              registry=r)

    def _cache(self) -> None:
        r = self.registry
        self.cache_hits = Counter("loraplane_agent_cache_hits",
                                  "Requests whose version was already loaded", ["adapter"],
                                  registry=r)
        self.cache_misses = Counter("loraplane_agent_cache_misses",
                                    "Requests that waited for their version to load",
                                    ["adapter"], registry=r)
        self.cache_evictions = Counter("loraplane_agent_cache_evictions",
                                       "Versions unloaded to make room (LRU)", ["adapter"],
                                       registry=r)
        self.load_seconds = Histogram("loraplane_agent_adapter_load_seconds",
                                      "Loading a version into vLLM (successful loads)",
                                      ["adapter"], buckets=_LOAD_BUCKETS, registry=r)
        self.versions_loaded = Gauge("loraplane_agent_versions_loaded",
                                     "Adapter versions loaded in vLLM", registry=r)
        self.loaded_bytes = Gauge("loraplane_agent_loaded_adapter_bytes",
                                  "Size on disk of the files of the versions loaded in "
                                  "vLLM (what vLLM reads into memory for them)",
                                  ["adapter"], registry=r)

    def _control(self) -> None:
        r = self.registry
        self.stage_seconds = Histogram("loraplane_agent_stage_seconds",
                                       "Time spent in each swap stage", ["stage"],
                                       buckets=_STAGE_BUCKETS, registry=r)
        self.event_delay = Histogram("loraplane_agent_event_delay_seconds",
                                     "From an event's commit in the registry (its time) to "
                                     "its receipt here", buckets=_STAGE_BUCKETS, registry=r)
        self.events_rejected = Counter("loraplane_agent_events_rejected",
                                       "Messages from the event stream not believed, by "
                                       "reason: unsigned, malformed, unknown_key, "
                                       "bad_signature (not signed by the registry), "
                                       "invalid (signed, yet not a valid event)",
                                       ["reason"], registry=r)
        self.bytes_downloaded = Counter("loraplane_agent_downloaded_bytes",
                                        "Adapter bytes downloaded from the registry",
                                        registry=r)
        self.file_fetches = Counter("loraplane_agent_file_fetches",
                                    "Files fetched, by source (direct: the blob store with "
                                    "an event's presigned URL; registry: its file path; "
                                    "inline: the bytes the event carried) and result (ok, "
                                    "or why a direct or inline fetch fell back)",
                                    ["source", "result"], registry=r)
        self.swaps = Counter("loraplane_agent_swaps", "Alias moves applied, by outcome",
                             ["adapter", "outcome"], registry=r)
        self.swap_seconds = Histogram("loraplane_agent_swap_seconds",
                                      "An applied alias move, from its start to the flip "
                                      "(download, checks and load included)", ["adapter"],
                                      buckets=_STAGE_BUCKETS, registry=r)
        self.failures = Counter("loraplane_agent_failures",
                                "Versions that failed to fetch, validate or load",
                                ["adapter", "code"], registry=r)
        self.tier_transitions = Counter("loraplane_agent_tier_transitions",
                                        "Adapter versions moving between tiers (cold: blob "
                                        "store only, warm: on disk, hot: loaded in vLLM)",
                                        ["from", "to"], registry=r)
        self.tier_seconds = Histogram("loraplane_agent_tier_transition_seconds",
                                      "Time each tier transition took", ["from", "to"],
                                      buckets=_STAGE_BUCKETS, registry=r)
        self.owned_adapters = Gauge("loraplane_agent_owned_adapters",
                                    "Adapters this agent owns by placement: kept_hot "
                                    "(pinned), over_capacity (no slot left to pin them; "
                                    "loaded on demand)", ["state"], registry=r)

    def count_fetch(self, source: str, result: str) -> None:
        self.file_fetches.labels(source=source, result=result).inc()

    def count_failure(self, adapter: str, exc: AgentError) -> None:
        """Count ``exc`` in ``failures_total{adapter,code}``, once per exception."""
        if not exc.counted:
            exc.counted = True
            self.failures.labels(adapter=self.adapter(adapter), code=exc.code).inc()

    def child(self, metric: M, *values: str) -> M:
        """``metric.labels(*values)``, kept: every proxied request takes four children,
        and ``labels`` validates and locks on each call. Only for metrics whose children
        are never removed (the request metrics), with bounded label values."""
        key = (metric, values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def count_tokens(self, adapter: str, usage: Mapping[str, object]) -> None:
        """Add an OpenAI ``usage`` object's prompt and completion tokens."""
        for kind in ("prompt", "completion"):
            value = usage.get(f"{kind}_tokens")
            if isinstance(value, int) and value > 0:
                self.child(self.tokens, self.adapter(adapter), kind).inc(value)

    def set_loaded_bytes(self, by_adapter: Mapping[str, int]) -> None:
        """Replace the per-adapter sizes of the loaded versions (folded names summed)."""
        folded: dict[str, int] = {}
        for adapter, size in by_adapter.items():
            label = self.adapter(adapter)
            folded[label] = folded.get(label, 0) + size
        self.loaded_bytes.clear()
        for label, size in folded.items():
            self.loaded_bytes.labels(adapter=label).set(size)

    @contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        """Time a swap stage (``fetch``, ``validate``, ``load``, ``flip``, ...)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.stage_seconds.labels(stage=stage).observe(time.perf_counter() - started)

    def tier_transition(self, source: str, target: str, seconds: float) -> None:
        """Count one version moving from tier ``source`` to ``target`` and its time."""
        labels = {"from": source, "to": target}
        self.tier_transitions.labels(**labels).inc()
        self.tier_seconds.labels(**labels).observe(seconds)

    def event_received(self, committed_at: datetime) -> None:
        """Observe how long an event took from the registry's commit to this agent."""
        if committed_at.tzinfo is None:  # the registry writes UTC
            committed_at = committed_at.replace(tzinfo=UTC)
        delay = (datetime.now(UTC) - committed_at).total_seconds()
        # Clocks of two hosts can disagree by a little: never a negative delay.
        self.event_delay.observe(max(0.0, delay))

    def render(self) -> bytes:
        """The exposition text; process memory is read from /proc as it is rendered."""
        return generate_latest(self.registry)
