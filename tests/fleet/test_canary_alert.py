"""The alert an operator gets when the analysis rolls a canary back: a real Prometheus
(Debian's, scripts/ci-tools.sh) scrapes the fleet's registry with the project's rules
(deploy/prometheus/alerts.yaml) while a canary whose version fails to load on every
agent is rolled back; ``LoraplaneCanaryRolledBack`` then fires for that alias."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devharness.prometheus import PrometheusServer
from devharness.waiting import eventually
from loraplane.api.canaries import CanaryAnalysis
from tests.deploy.promtool import RULES
from tests.fleet.canaries import ended
from tests.fleet.conftest import FleetUnderTest

pytestmark = [pytest.mark.e2e]

ALERT = "LoraplaneCanaryRolledBack"


@pytest.fixture
async def prometheus(fleet: FleetUnderTest, tmp_path: Path) -> AsyncIterator[PrometheusServer]:
    hosts = {"loraplane-registry": [fleet.fleet.registry.url.removeprefix("http://")]}
    with PrometheusServer(tmp_path / "prometheus", hosts, rules=[RULES]) as server:
        try:
            yield server
        finally:
            await server.aclose()


async def test_a_rolled_back_canary_fires_its_alert(fleet: FleetUnderTest,
                                                    prometheus: PrometheusServer) -> None:
    name = await fleet.make("alerted")
    fleet.fleet.standin.set_fault(f"{name}@2", load_status=500)
    async with fleet.load(name).running() as load:
        await fleet.hot_everywhere(name, load)
        await fleet.api.start_canary(name, 2, steps=[50], step_seconds=1,
                                     analysis=CanaryAnalysis(min_requests=50))
        aborted = await ended(fleet.api, name, "aborted")
    assert aborted.reason is not None and "load_failures" in aborted.reason

    async def firing() -> list[dict[str, Any]] | None:
        found = await prometheus.query(
            f'ALERTS{{alertname="{ALERT}", alertstate="firing", adapter="{name}"}}')
        return found or None

    alerts = await eventually(firing, timeout_s=120, interval_s=0.5,
                              what=f"{ALERT} firing for {name}")
    assert [(a["metric"]["alias"], a["metric"]["severity"]) for a in alerts] == [
        ("live", "warning")]
    # What the alert reads: the registry's gauge, at the rollback's time.
    stamp = await prometheus.query(
        f'loraplane_registry_canary_rolled_back_timestamp_seconds{{adapter="{name}"}}')
    assert abs(float(stamp[0]["value"][1]) - aborted.updated_at.timestamp()) < 5, stamp
