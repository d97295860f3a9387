"""The analysis reading a real Prometheus (both backends): Prometheus scrapes an agent's
metrics (the agent's own ``AgentMetrics``, served over HTTP), the canary's checks come
from PromQL over the ``track`` label, the user's own queries are checks too (no value
fails, a refused query fails), and a Prometheus that does not answer leaves the step
inconclusive. An analysis that needs Prometheus is refused when there is none."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from devharness.prometheus import PrometheusServer
from devharness.registry import RegistryHarness
from devharness.waiting import eventually
from inference_agent.metrics import CONTENT_TYPE, AgentMetrics
from loraplane.netutil import free_port
from registry_service.canaries.analyst import CanaryAnalyst
from registry_service.canaries.judge import Judged
from tests.agent.proxy_harness import serve_asgi
from tests.registry.canaries import support as c

ERRORS = ('sum(increase(loraplane_agent_requests_total{adapter="{{adapter}}",'
          'track="canary",status=~"5.."}[{{window}}]))')


@dataclass
class Fleet:
    """One agent's metrics as Prometheus scrapes them, and an analyst reading it."""

    metrics: AgentMetrics
    prometheus: PrometheusServer
    analyst: CanaryAnalyst

    def serve(self, track: str, requests: int, seconds: float, status: str = "200") -> None:
        m = self.metrics
        for _ in range(requests):
            m.child(m.requests, "bot", status, track).inc()
            m.child(m.request_latency, "bot", track).observe(seconds)

    async def scraped(self, total: float) -> None:
        """Until Prometheus holds ``total`` requests of ``bot``."""
        async def seen() -> bool:
            found = await self.prometheus.query(
                'sum(loraplane_agent_requests_total{adapter="bot"})')
            return bool(found) and float(found[0]["value"][1]) == total
        await eventually(seen, what=f"{total} requests scraped")

    async def scraped_since(self, since: float) -> None:
        """Until Prometheus has scraped the agent after ``since`` (Unix time): the
        first sample of a new window, for increase() to count from."""
        async def seen() -> bool:
            found = await self.prometheus.query('max(timestamp(loraplane_agent_requests_total'
                                                '{adapter="bot"}))')
            return bool(found) and float(found[0]["value"][1]) > since
        await eventually(seen, what="a scrape after the canary started")

    async def judge(self, registry: RegistryHarness, cid: int) -> Judged:
        await c.make_due(registry, cid)
        judged = await self.analyst.tick()
        assert len(judged) == 1, judged
        return judged[0]


@pytest.fixture
async def fleet(registry: RegistryHarness, tmp_path: Path) -> AsyncIterator[Fleet]:
    metrics = AgentMetrics()

    async def scrape(_request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    async with serve_asgi(Starlette(routes=[Route("/metrics", scrape)])) as url:
        prometheus = PrometheusServer(tmp_path / "prometheus",
                                      {"agents": [url.removeprefix("http://")]})
        await asyncio.to_thread(prometheus.start)
        own = registry.ctx.analyst
        assert own is not None
        await own.stop()  # this test's analyst reads Prometheus; it ticks by hand
        registry.ctx.settings.prometheus_url = prometheus.url
        analyst = CanaryAnalyst(registry.ctx.db, interval_s=1, lease_s=60,
                                prometheus_url=prometheus.url)
        try:
            yield Fleet(metrics, prometheus, analyst)
        finally:
            await analyst.stop()
            await prometheus.aclose()
            await asyncio.to_thread(prometheus.process.stop, 10)


async def _started(registry: RegistryHarness, tmp_path: Path, fleet: Fleet,
                   **analysis: Any) -> int:
    """A canary reading Prometheus, whose series Prometheus has seen at 0 (increase
    counts from there)."""
    cid = await c.running(registry, tmp_path, analysis={**c.ANALYSIS, "source": "prometheus",
                                                        **analysis})
    m = fleet.metrics
    for track in ("stable", "canary"):
        for status in ("200", "500"):
            m.child(m.requests, "bot", status, track)
        m.child(m.request_latency, "bot", track)
    await fleet.scraped(0)
    return cid


async def test_a_slower_canary_in_prometheus_is_rolled_back(
    registry: RegistryHarness, tmp_path: Path, fleet: Fleet,
) -> None:
    cid = await _started(registry, tmp_path, fleet)
    fleet.serve("stable", 200, 0.09)
    fleet.serve("canary", 50, 0.2)
    await fleet.scraped(250)
    judged = await fleet.judge(registry, cid)
    assert judged.outcome == "rollback" and "latency_p95" in judged.reason, judged
    aborted = await c.canary_when(registry, state="aborted")
    checks = {check["metric"]: check for check in aborted["checks"]}
    # Prometheus' increase() extrapolates to the window's edges, alike for both series.
    stable, canary = checks["requests"]["stable"], checks["requests"]["canary"]
    assert 200 <= stable < 300 and 50 <= canary < 75
    assert checks["latency_p95"]["verdict"] == "fail"
    assert checks["latency_p95"]["canary"] > 2 * checks["latency_p95"]["stable"]


async def test_a_healthy_canary_in_prometheus_advances_and_own_queries_are_checks(
    registry: RegistryHarness, tmp_path: Path, fleet: Fleet,
) -> None:
    queries = [{"name": "errors", "query": ERRORS, "max": 0},
               {"name": "absent", "query": 'sum(no_such_metric{x="{{alias}}"})', "max": 1}]
    cid = await _started(registry, tmp_path, fleet, queries=queries[:1])
    fleet.serve("stable", 200, 0.09)
    fleet.serve("canary", 50, 0.09)
    await fleet.scraped(250)
    judged = await fleet.judge(registry, cid)
    assert judged.next == "advance", judged
    stepped = await c.canary_when(registry, step=2)
    query = next(check for check in stepped["checks"] if check["metric"] == "query:errors")
    assert (query["canary"], query["verdict"]) == (0, "pass")
    assert stepped["reason"] == "step 1 of 2 (10%) passed; now 50%"
    # The next step: 5 errors on the canary fail the user's query; one without a value
    # fails too.
    status, _ = await c.call(registry, "POST", f"{c.CANARY}/abort")
    assert status == 200
    status, started = await c.start_canary(registry, version=3, analysis={
        **c.ANALYSIS, "source": "prometheus", "queries": queries})
    assert status == 201, started
    await fleet.scraped_since(datetime.fromisoformat(started["started_at"]).timestamp())
    fleet.serve("canary", 5, 0.09, status="500")
    fleet.serve("stable", 100, 0.09)
    fleet.serve("canary", 45, 0.09)
    await fleet.scraped(400)
    judged = await fleet.judge(registry, started["id"])
    assert judged.outcome == "rollback"
    assert "query errors gave 5" in judged.reason  # about 5: increase() extrapolates
    assert "query absent gave no value" in judged.reason


async def test_a_prometheus_that_does_not_answer_leaves_the_step_inconclusive(
    registry: RegistryHarness, tmp_path: Path, fleet: Fleet,
) -> None:
    cid = await _started(registry, tmp_path, fleet)
    gone = CanaryAnalyst(registry.ctx.db, interval_s=1, lease_s=60,
                         prometheus_url=f"http://127.0.0.1:{free_port()}")
    try:
        await c.make_due(registry, cid)
        await fleet.analyst.release()
        judged = await gone.tick()
    finally:
        await gone.stop()
    assert [j.next for j in judged] == ["extend"], judged
    assert "Prometheus did not answer" in judged[0].reason


async def test_an_analysis_reading_prometheus_needs_one(registry: RegistryHarness,
                                                       tmp_path: Path) -> None:
    await c.bot(registry, tmp_path)
    for analysis in ({"source": "prometheus"},
                     {"queries": [{"name": "q", "query": "up", "max": 1}]}):
        status, body = await c.start_canary(registry, analysis=analysis)
        assert status == 422 and body["error"]["code"] == "prometheus_not_configured"
    status, _ = await c.start_canary(registry, analysis={"source": "auto"})
    assert status == 201
