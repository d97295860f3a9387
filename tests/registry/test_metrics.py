"""Every registry metric moves when its action happens, as ``/metrics`` of a registry
served over HTTP (uvicorn, real NATS) shows it.

``MOVED_BY`` names, for each metric family the registry declares, the test here that
performs its action and reads ``/metrics`` before and after; a metric added to
``RegistryMetrics`` without such a test fails ``test_every_metric_has_a_test``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.services import NatsService
from devharness.uploads import upload, upload_dir
from devharness.waiting import eventually
from registry_service.metrics import UPLOAD_PHASES, RegistryMetrics
from tests.agent.loop_support import served_registry

PREFIX = "loraplane_registry_"

MOVED_BY = {
    "requests": "test_requests_and_latency_count_each_request",
    "request_seconds": "test_requests_and_latency_count_each_request",
    "upload_bytes": "test_an_upload_counts_its_bytes_and_a_new_version",
    "versions_created": "test_an_upload_counts_its_bytes_and_a_new_version",
    "upload_phase_seconds": "test_an_upload_times_each_of_its_phases",
    "uploads_refused": "test_refused_uploads_are_counted_by_their_code",
    "events_published": "test_the_relay_counts_published_events",
    "outbox_pending": "test_a_nats_outage_shows_pending_rows_and_relay_errors",
    "outbox_oldest_age_seconds": "test_a_nats_outage_shows_pending_rows_and_relay_errors",
    "relay_errors": "test_a_nats_outage_shows_pending_rows_and_relay_errors",
    "uploads": "test_refused_uploads_are_counted_by_their_code",
    "relay_publish_seconds": "test_the_relay_counts_published_events",
    # In test_metrics_fleet.py:
    "alias_agents_expected": "test_alias_convergence_and_last_reports_follow_the_agents",
    "alias_agents_converged": "test_alias_convergence_and_last_reports_follow_the_agents",
    "alias_agents_failed": "test_alias_convergence_and_last_reports_follow_the_agents",
    "agent_last_report_timestamp_seconds":
        "test_alias_convergence_and_last_reports_follow_the_agents",
    "report_batch_size": "test_each_batch_of_reports_is_observed_with_its_size",
    # In blobs/test_gc_metrics.py:
    "blob_gc_running": "test_a_pass_counts_what_it_examined_and_deleted",
    "blob_gc_blobs_examined": "test_a_pass_counts_what_it_examined_and_deleted",
    "blob_gc_deleted": "test_a_pass_counts_what_it_examined_and_deleted",
    "blob_gc_pass_seconds": "test_a_pass_counts_what_it_examined_and_deleted",
    # In canaries/test_canary_metrics.py:
    "canary_state": "test_a_running_canary_shows_its_state_step_weight_and_checks",
    "canary_step": "test_a_running_canary_shows_its_state_step_weight_and_checks",
    "canary_weight_percent": "test_a_running_canary_shows_its_state_step_weight_and_checks",
    "canary_paused_seconds": "test_a_running_canary_shows_its_state_step_weight_and_checks",
    "canary_check_value": "test_a_running_canary_shows_its_state_step_weight_and_checks",
    "canary_steps_judged": "test_a_running_canary_shows_its_state_step_weight_and_checks",
    "canary_rolled_back_timestamp_seconds": "test_a_rollback_by_the_analysis_shows_when",
}


async def read(registry: RegistryHarness, sample: str, **labels: str) -> float:
    """The sum of ``PREFIX + sample`` over the series whose labels include ``labels``."""
    response = await registry.client.get("/metrics")
    assert response.status_code == 200, response.text
    return sum(s.value for family in text_string_to_metric_families(response.text)
               for s in family.samples
               if s.name == PREFIX + sample and labels.items() <= s.labels.items())


@pytest.fixture
async def served(tmp_path: Path, nats: NatsService) -> AsyncIterator[RegistryHarness]:
    """The registry app behind uvicorn on a port: every call below is real HTTP."""
    async with served_registry(tmp_path, nats) as registry:
        yield registry.harness


def test_every_metric_has_a_test() -> None:
    declared = {family.name.removeprefix(PREFIX)
                for family in RegistryMetrics().registry.collect()}
    assert declared == set(MOVED_BY)
    from tests.registry import test_metrics_fleet
    from tests.registry.blobs import test_gc_metrics
    from tests.registry.canaries import test_canary_metrics

    modules = (test_metrics_fleet, test_gc_metrics, test_canary_metrics)
    assert all(callable(globals().get(test)
                        or next((getattr(m, test) for m in modules if hasattr(m, test)), None))
               for test in MOVED_BY.values())


async def test_requests_and_latency_count_each_request(
    served: RegistryHarness,
) -> None:
    registry = served
    route = {"method": "GET", "route": "/healthz"}
    requests = await read(registry, "requests_total", status="200", **route)
    timed = await read(registry, "request_seconds_count", **route)
    for _ in range(3):
        assert (await registry.client.get("/healthz")).status_code == 200
    assert await read(registry, "requests_total", status="200", **route) == requests + 3
    assert await read(registry, "request_seconds_count", **route) == timed + 3
    missing = {"method": "GET", "route": "/v1/adapters/{name}", "status": "404"}
    before = await read(registry, "requests_total", **missing)
    response = await registry.client.get("/v1/adapters/nope", headers=registry.admin_headers)
    assert response.status_code == 404
    assert await read(registry, "requests_total", **missing) == before + 1


async def test_an_upload_counts_its_bytes_and_a_new_version(
    served: RegistryHarness, tmp_path: Path,
) -> None:
    registry = served
    await registry.create_adapter("bot")
    folder = make_adapter(tmp_path / "a", seed=1)
    size = sum(f.stat().st_size for f in folder.iterdir())
    received, created = (await read(registry, "upload_bytes_total"),
                         await read(registry, "versions_created_total"))
    outcomes = {o: await read(registry, "uploads_total", outcome=o)
                for o in ("created", "unchanged")}
    assert (await upload_dir(registry, "bot", folder)).status_code == 201
    # The body is the files plus the multipart framing around them.
    after = await read(registry, "upload_bytes_total")
    assert size < after - received < size + 4096
    assert await read(registry, "versions_created_total") == created + 1
    # An identical re-upload is received again but creates nothing.
    assert (await upload_dir(registry, "bot", folder)).status_code == 200
    assert await read(registry, "upload_bytes_total") > after
    assert await read(registry, "versions_created_total") == created + 1
    for outcome, count in outcomes.items():
        assert await read(registry, "uploads_total", outcome=outcome) == count + 1


async def test_an_upload_times_each_of_its_phases(
    served: RegistryHarness, tmp_path: Path,
) -> None:
    registry = served
    await registry.create_adapter("bot")
    folder = make_adapter(tmp_path / "a", seed=1)

    async def per_phase(sample: str) -> dict[str, float]:
        return {p: await read(registry, sample, phase=p) for p in UPLOAD_PHASES}

    counts, sums = (await per_phase("upload_phase_seconds_count"),
                    await per_phase("upload_phase_seconds_sum"))
    assert (await upload_dir(registry, "bot", folder)).status_code == 201
    for phase in UPLOAD_PHASES:
        assert await read(registry, "upload_phase_seconds_count", phase=phase) \
            == counts[phase] + 1, phase
        assert await read(registry, "upload_phase_seconds_sum", phase=phase) > sums[phase]
    # A refused upload records the phases it reached, and no later one.
    config = [("files", ("adapter_config.json", (folder / "adapter_config.json").read_bytes()))]
    assert (await upload(registry, "bot", config)).status_code == 422
    reached = await per_phase("upload_phase_seconds_count")
    assert [reached[p] - counts[p] for p in UPLOAD_PHASES] == [2, 2, 2, 1, 1, 1]


async def test_refused_uploads_are_counted_by_their_code(
    served: RegistryHarness, tmp_path: Path,
) -> None:
    registry = served
    await registry.create_adapter("bot")
    folder = make_adapter(tmp_path / "a", seed=1)
    config = [("files", ("adapter_config.json", (folder / "adapter_config.json").read_bytes()))]
    cases: list[tuple[str, Callable[[], Awaitable[httpx.Response]]]] = [
        ("missing_weights", lambda: upload(registry, "bot", config)),
        ("adapter_not_found", lambda: upload_dir(registry, "ghost", folder)),
        ("not_multipart", lambda: registry.client.post(
            "/v1/adapters/bot/versions", content=b"{}", headers={
                **registry.admin_headers, "Content-Type": "application/json"})),
    ]
    created = await read(registry, "versions_created_total")
    refused = await read(registry, "uploads_total", outcome="refused")
    for code, send in cases:
        before = await read(registry, "uploads_refused_total", code=code)
        response = await send()
        assert response.json()["error"]["code"] == code, response.text
        assert await read(registry, "uploads_refused_total", code=code) == before + 1, code
    assert await read(registry, "versions_created_total") == created
    assert await read(registry, "uploads_total", outcome="refused") == refused + len(cases)


async def publish(registry: RegistryHarness, name: str, folder: Path) -> None:
    """A new version: ``version_published`` and ``adapter_updated`` go to the outbox
    (``adapter_created`` does not: it is born published, for the audit log only)."""
    await registry.create_adapter(name)
    assert (await upload_dir(registry, name, folder)).status_code == 201


async def test_the_relay_counts_published_events(
    served: RegistryHarness, tmp_path: Path,
) -> None:
    registry = served
    published = await read(registry, "events_published_total")
    timed = await read(registry, "relay_publish_seconds_count")
    await publish(registry, "bot", make_adapter(tmp_path / "a", seed=1))

    async def moved() -> bool:
        return (await read(registry, "events_published_total") == published + 2
                and await read(registry, "relay_publish_seconds_count") == timed + 2)

    await eventually(moved, what="both events of the upload counted as published")


async def test_a_nats_outage_shows_pending_rows_and_relay_errors(
    served: RegistryHarness, tmp_path: Path,
) -> None:
    registry = served
    errors = await read(registry, "relay_errors_total")
    await registry.nats.stop_async()
    try:
        await publish(registry, "during", make_adapter(tmp_path / "a", seed=1))

        async def stalled() -> bool:
            return (await read(registry, "relay_errors_total") > errors
                    and await read(registry, "outbox_pending") == 2
                    and await read(registry, "outbox_oldest_age_seconds") > 0)

        await eventually(stalled, timeout_s=60, what="failed publishes and a pending row")
    finally:
        await registry.nats.start_async()

    async def drained() -> bool:
        return (await read(registry, "outbox_pending") == 0
                and await read(registry, "outbox_oldest_age_seconds") == 0)

    await eventually(drained, timeout_s=60, what="the outbox drained after NATS came back")
