"""The fleet's gauges on the registry's ``/metrics``: each alias's convergence from the
agents' reports, and when each agent last reported. Part of ``test_metrics.MOVED_BY``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir
from loraplane.events import AgentStatus
from registry_service.agents import convergence, report_read
from registry_service.agents.convergence import FleetGauges
from registry_service.agents.report_read import StoredReport
from registry_service.agents.reports import upsert_agent_status
from registry_service.db.engine import Database
from registry_service.metrics import AliasConvergence, RegistryMetrics
from tests.registry.agents.support import age_agent, post_status, report, served
from tests.registry.test_metrics import read

ALIAS = {"adapter": "bot", "alias": "live"}


async def _gauges(registry: RegistryHarness) -> tuple[float, float, float]:
    return (await read(registry, "alias_agents_expected", **ALIAS),
            await read(registry, "alias_agents_converged", **ALIAS),
            await read(registry, "alias_agents_failed", **ALIAS))


async def test_alias_convergence_and_last_reports_follow_the_agents(
    registry: RegistryHarness, tmp_path: Path,
) -> None:
    await registry.create_adapter("bot")
    assert (await upload_dir(registry, "bot", make_adapter(tmp_path / "a", seed=1))
            ).status_code == 201
    # No agent yet: nobody owes the version, nobody serves it.
    assert await _gauges(registry) == (0, 0, 0)
    before = time.time()
    for body in (report("gpu-a", entries=[served("bot", 1)]),
                 report("gpu-b", failures=[served("bot", 1, state="failed",
                                                  code="rank_too_large")]),
                 report("gpu-c", entries=[served("bot", 1, state="loading")])):
        assert (await post_status(registry, body)).status_code == 200
    assert await _gauges(registry) == (3, 1, 1)
    seen = await read(registry, "agent_last_report_timestamp_seconds", agent="gpu-a")
    assert before - 1 <= seen <= time.time() + 1
    # A stale agent no longer owes anything; its last report still shows when it was.
    await age_agent(registry, "gpu-b", 3600)
    assert await _gauges(registry) == (2, 1, 0)
    old = await read(registry, "agent_last_report_timestamp_seconds", agent="gpu-b")
    assert old < before - 3000
    # The last agent catches up: converged.
    assert (await post_status(registry, report("gpu-c", entries=[served("bot", 1)]))
            ).status_code == 200
    assert await _gauges(registry) == (2, 2, 0)


def test_adapters_past_the_label_limit_are_summed_as_other() -> None:
    metrics = RegistryMetrics(max_adapters=2)
    metrics.set_fleet([AliasConvergence(f"a{i}", "live", 2, i % 2, 0) for i in range(5)], {})
    sample = metrics.registry.get_sample_value
    expected = "loraplane_registry_alias_agents_expected"
    assert sample(expected, {"adapter": "a0", "alias": "live"}) == 2
    assert sample(expected, {"adapter": "a1", "alias": "live"}) == 2
    assert sample(expected, {"adapter": "_other", "alias": "live"}) == 6
    assert sample("loraplane_registry_alias_agents_converged",
                  {"adapter": "_other", "alias": "live"}) == 1
    series = {s.labels["adapter"] for family in metrics.registry.collect()
              if family.name == expected for s in family.samples}
    assert series == {"a0", "a1", "_other"}


async def test_each_batch_of_reports_is_observed_with_its_size(
    registry: RegistryHarness,
) -> None:
    batches = await read(registry, "report_batch_size_count")
    reports = await read(registry, "report_batch_size_sum")
    answers = await asyncio.gather(*(post_status(registry, report(f"gpu-{i}"))
                                     for i in range(6)))
    assert [a.status_code for a in answers] == [200] * 6
    # However the six fell into batches, each report is in exactly one.
    assert await read(registry, "report_batch_size_sum") == reports + 6
    assert batches + 1 <= await read(registry, "report_batch_size_count") <= batches + 6


async def _store(db: Database, agent_id: str) -> None:
    async with db.session() as session:
        await upsert_agent_status(session, AgentStatus.model_validate(report(agent_id)),
                                  stale_after_s=90.0)
        await session.commit()


def _last_report(metrics: RegistryMetrics, agent_id: str) -> float | None:
    return metrics.registry.get_sample_value(
        "loraplane_registry_agent_last_report_timestamp_seconds", {"agent": agent_id})


async def test_scrapes_within_the_max_age_read_the_last_recomputation(
    db: Database, monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[int] = []
    real_read = report_read.stored_reports

    async def counted(session: AsyncSession) -> list[StoredReport]:
        reads.append(1)
        return await real_read(session)

    monkeypatch.setattr(convergence, "stored_reports", counted)
    metrics = RegistryMetrics()
    gauges = FleetGauges(db, metrics, stale_after_s=90.0, max_age_s=3600.0)
    await _store(db, "gpu-a")
    # Concurrent scrapes share one recomputation.
    await asyncio.gather(*(gauges.refresh() for _ in range(3)))
    assert len(reads) == 1 and _last_report(metrics, "gpu-a") is not None
    await _store(db, "gpu-b")
    await gauges.refresh()
    assert len(reads) == 1 and _last_report(metrics, "gpu-b") is None  # the last values
    every_scrape = FleetGauges(db, metrics, stale_after_s=90.0, max_age_s=0.0)
    await every_scrape.refresh()
    assert len(reads) == 2 and _last_report(metrics, "gpu-b") is not None


async def test_a_recomputation_that_failed_is_tried_again_at_the_next_scrape(
    db: Database, monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_read = report_read.stored_reports
    failing = [True]

    async def flaky(session: AsyncSession) -> list[StoredReport]:
        if failing.pop() if failing else False:
            raise OperationalError("SELECT", {}, Exception("the database went away"))
        return await real_read(session)

    monkeypatch.setattr(convergence, "stored_reports", flaky)
    metrics = RegistryMetrics()
    gauges = FleetGauges(db, metrics, stale_after_s=90.0, max_age_s=3600.0)
    await _store(db, "gpu-a")
    await gauges.refresh()  # failed: the gauges keep their (empty) values
    assert _last_report(metrics, "gpu-a") is None
    await gauges.refresh()
    assert _last_report(metrics, "gpu-a") is not None
