"""The alerts and the dashboard on real data: a real Prometheus (Debian's) scrapes the
testbed's registry and both agents while a short workload runs (a push, requests
through both agents, streamed and not, a refused one, a second version and its
promotion, a canary judged once and one the analysis rolls back); then every alert
expression and every dashboard query, asked through Prometheus' HTTP API, returns data.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from deploy.grafana.build import OUTPUT as DASHBOARD
from devharness.openai_client import RETRY_OVER_HTTP, OpenAIClient
from devharness.prometheus import PrometheusServer
from devharness.testbed import Testbed
from devharness.waiting import eventually
from loraplane.api.canaries import CanaryAnalysis
from loraplane.client import AsyncRegistryClient
from tests.deploy.promtool import RULES
from tests.e2e.steps import make_canary_due, new_adapter, publish, served_by

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

# An alert's expression ends in a threshold (``> 0.01``) that filters out every series
# while all is well, so on a healthy testbed it would return nothing and prove nothing.
# ``bool`` turns each comparison into 0 or 1 per series instead of a filter: the whole
# expression, threshold included, is evaluated, and returns one sample per series it
# sees. A label matcher (``!="_unresolved"``) is not followed by a number, so it stays.
_THRESHOLD = re.compile(r"(>=|<=|==|!=|>|<)\s*(?=-?[0-9])")
# The dashboard's queries use Grafana's interval; Prometheus scrapes every second here.
_GRAFANA_INTERVAL = "$__rate_interval"


def unfiltered(expr: str) -> str:
    return _THRESHOLD.sub(r"\1 bool ", expr)


def alert_exprs() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: unfiltered(rule["expr"]) for group in groups
            for rule in group["rules"]}


def dashboard_exprs() -> dict[str, str]:
    board = json.loads(DASHBOARD.read_text())
    return {f"{panel['title']} [{target['refId']}]":
            target["expr"].replace(_GRAFANA_INTERVAL, "1m")
            for panel in board["panels"] for target in panel.get("targets", [])}


def test_unfiltered_keeps_the_expression_but_its_filters() -> None:
    assert unfiltered('rate(x{a!="b"}[5m]) > 0.01') == 'rate(x{a!="b"}[5m]) > bool 0.01'
    assert unfiltered("(t - x > 180) and (t - x < 86400)") == \
        "(t - x > bool 180) and (t - x < bool 86400)"


@pytest.fixture
async def prometheus(testbed: Testbed, tmp_path: Path) -> AsyncIterator[PrometheusServer]:
    hosts = {"loraplane-registry": [testbed.registry.url.removeprefix("http://")],
             "loraplane-agent": [a.url.removeprefix("http://") for a in testbed.agents.values()]}
    with PrometheusServer(tmp_path / "prometheus", hosts, rules=[RULES]) as server:
        try:
            yield server
        finally:
            await server.aclose()


async def _workload(testbed: Testbed, api: AsyncRegistryClient,
                    clients: dict[str, OpenAIClient], name: str) -> None:
    await new_adapter(api, name, testbed.adapter_dir("a1"))
    for client in clients.values():
        await served_by(client, name, f"{name}@1", timeout_s=60)
        for _ in range(3):
            assert (await client.complete(name, max_tokens=4)).ok
        streamed = await client.stream(name, max_tokens=4,
                                       stream_options={"include_usage": True})
        assert streamed.ok, streamed
        assert (await client.complete(f"missing-{name}", max_tokens=4)).status == 404
    version = await publish(api, name, testbed.adapter_dir("a2"), aliases=())
    await api.move_alias(name, "live", version)
    for client in clients.values():
        await served_by(client, name, f"{name}@{version}", timeout_s=60)
        assert (await client.complete(name, max_tokens=4)).ok
    await _canaries(testbed, api, name)


async def _canaries(testbed: Testbed, api: AsyncRegistryClient, name: str) -> None:
    """On ``live``, a canary of version 1 judged once (no traffic: watched again, its
    checks kept), then paused; on ``beta``, one the analysis rolls back (nothing to wait
    for)."""
    await api.move_alias(name, "beta", 2)
    held = await api.start_canary(name, 1, steps=[10], step_seconds=3600)
    gone = await api.start_canary(name, 1, alias="beta", steps=[10], step_seconds=3600,
                                  analysis=CanaryAnalysis(inconclusive_limit=0))
    for canary in (held, gone):
        await make_canary_due(testbed, canary.id)

    async def judged() -> bool:
        live, beta = await api.get_canary(name), await api.list_canaries(name, "beta")
        return bool(live.checks) and beta.canaries[0].state == "aborted"

    await eventually(judged, timeout_s=60, what="both canaries judged")
    await api.pause_canary(name, reason="for the paused gauge")


async def _empty(prometheus: PrometheusServer, exprs: dict[str, str]) -> list[str]:
    return [label for label, expr in exprs.items() if not await prometheus.query(expr)]


async def test_every_alert_and_dashboard_query_returns_data(
        testbed: Testbed, api: AsyncRegistryClient, agent_a: OpenAIClient,
        agent_b: OpenAIClient, prometheus: PrometheusServer, unique: str) -> None:
    async def all_up() -> bool:
        targets = await prometheus.targets()
        return len(targets) == 3 and all(t["health"] == "up" for t in targets)

    await eventually(all_up, timeout_s=60, retrying=RETRY_OVER_HTTP,
                     what="Prometheus scraping the registry and both agents")
    await _workload(testbed, api, {"a": agent_a, "b": agent_b}, f"prom-{unique}")
    queries = {**{f"alert {k}": v for k, v in alert_exprs().items()},
               **{f"panel {k}": v for k, v in dashboard_exprs().items()}}
    assert len(queries) == 11 + len(dashboard_exprs())

    async def answered() -> bool | None:
        missing = await _empty(prometheus, queries)
        return True if not missing else None

    try:
        await eventually(answered, timeout_s=120, retrying=RETRY_OVER_HTTP,
                         what="every alert expression and dashboard query returning data")
    except AssertionError as exc:
        raise AssertionError(f"no data for: {await _empty(prometheus, queries)}") from exc

    async def rules_evaluated() -> bool:
        rules = await prometheus.rules()
        return (len(rules) == 11 and all(r["health"] == "ok" and not r.get("lastError")
                                         for r in rules))

    await eventually(rules_evaluated, timeout_s=30, retrying=RETRY_OVER_HTTP,
                     what="Prometheus evaluating all eleven alert rules without an error")
    await api.abort_canary(f"prom-{unique}", reason="test over")
