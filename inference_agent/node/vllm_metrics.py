"""A copy in memory of a few of vLLM's own ``/metrics`` series, refreshed when scraped.

A gateway's endpoint picker scrapes the agent (about every 50 ms, per picker replica)
for vLLM's queue and KV-cache series. Asking vLLM at each of those scrapes would put
every picker's polling on vLLM's API server; instead the agent keeps the text of the
families it passes on and asks vLLM again only when a scrape finds that copy older than
``interval_s``: one call to vLLM per ``interval_s`` however many pickers scrape, and
none while nobody does. Concurrent scrapes that find the copy old share one call; the
copy is taken once at start-up too. Why: docs/decisions.md#vllms-metrics-are-copied-when-scraped

A copy older than ``max_age_s`` (vLLM has not answered since) is dropped rather than
served: stale queue lengths would steer requests to a server that may be gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from inference_agent.errors import VllmUnavailable

log = logging.getLogger(__name__)

# What llm-d's endpoint picker reads from a vLLM server besides the LoRA series.
# ``vllm:gpu_cache_usage_perc`` is the name older vLLM releases (and older pickers) use
# for ``vllm:kv_cache_usage_perc``; whichever vLLM emits is passed on.
PASSED_FAMILIES = frozenset({
    "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc", "vllm:cache_config_info"})


def select_families(exposition: str, families: Iterable[str]) -> str:
    """The lines of ``exposition`` (Prometheus text) that belong to ``families``: their
    ``# HELP`` and ``# TYPE`` lines and their samples, in vLLM's order."""
    wanted = frozenset(families)
    kept = []
    for line in exposition.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            keep = len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] in wanted
        else:
            name = line.partition("{")[0].partition(" ")[0]
            keep = bool(name) and name in wanted
        if keep:
            kept.append(line + "\n")
    return "".join(kept)


class VllmMetricsMirror:
    """The passed-on families as of the last scrape of vLLM; ``run`` keeps it fresh."""

    def __init__(self, fetch: Callable[[], Awaitable[str]], *, interval_s: float,
                 max_age_s: float | None = None, registry: CollectorRegistry | None = None,
                 families: Iterable[str] = PASSED_FAMILIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``fetch`` answers vLLM's ``/metrics`` text or raises VllmUnavailable."""
        self._fetch = fetch
        self.interval_s = interval_s
        # Ten missed scrapes, and never less than a few seconds: a busy vLLM may be slow
        # to answer one scrape without being gone.
        self.max_age_s = max_age_s if max_age_s is not None else max(5.0, 10 * interval_s)
        self.families = frozenset(families)
        self._clock = clock
        self._text = ""
        self._at: float | None = None
        self._refreshing: asyncio.Task[bool] | None = None
        self.scrapes = Counter("loraplane_agent_vllm_metrics_scrapes",
                               "Scrapes of vLLM's /metrics for the series passed on, by "
                               "outcome", ["outcome"], registry=registry)
        self.age = Gauge("loraplane_agent_vllm_metrics_age_seconds",
                         "Age of the vLLM series /metrics passes on (-1: none yet)",
                         registry=registry)
        self.age.set_function(lambda: self.age_s() if self._at is not None else -1.0)

    def age_s(self) -> float:
        return self._clock() - self._at if self._at is not None else float("inf")

    def text(self) -> str:
        """The passed-on families, or nothing when the copy is too old (or none yet)."""
        return self._text if self.age_s() <= self.max_age_s else ""

    async def refresh(self) -> bool:
        """Scrape vLLM once; False (and the old copy kept until it ages out) on failure."""
        try:
            exposition = await self._fetch()
        except VllmUnavailable as exc:
            self.scrapes.labels(outcome="failed").inc()
            log.debug("vLLM metrics not scraped: %s", exc.message)
            return False
        self._text = select_families(exposition, self.families)
        self._at = self._clock()
        self.scrapes.labels(outcome="ok").inc()
        return True

    async def current(self) -> str:
        """``text()`` for a scrape of the agent: refreshed first (one shared call to
        vLLM) when the copy is older than ``interval_s``."""
        if self.age_s() > self.interval_s:
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.create_task(self.refresh(), name="vllm-metrics")
            # Shielded: a scraper that hangs up must not cancel the call others share.
            await asyncio.shield(self._refreshing)
        return self.text()
