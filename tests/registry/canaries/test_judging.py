"""The canary analyst on both backends, fed by agents' reports as agents send them:
a healthy canary advances step by step and promotes (the alias moves), a failing one
is rolled back or paused with the failing check as its reason (the alias stays), one
without traffic never promotes, a version that failed to load fails its checks, and
a step is judged once whatever the number of analysts. Steps are made due by moving
their start back in the database, never by waiting out a step."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import update

from devharness.registry import RegistryHarness
from loraplane.events import TRAFFIC_BUCKETS, AgentStatus
from registry_service.canaries.analyst import CanaryAnalyst
from registry_service.canaries.models import CanaryRow
from registry_service.db.base import utcnow
from tests.registry.agents.support import BASE_MODEL, post_status
from tests.registry.canaries.support import (
    ALIAS,
    ANALYSIS,
    CANARY,
    alias_events,
    alias_version,
    call,
    canary_when,
    first_step,
    make_due,
    report,
    running,
    side,
)


async def moves(registry: RegistryHarness) -> list[tuple[str, str, str | None]]:
    """The alias's history, newest first: action, actor, reason."""
    _, body = await call(registry, "GET", f"{ALIAS}/history")
    return [(m["action"], m["actor"], m["reason"]) for m in body["moves"]]


async def test_a_healthy_canary_advances_and_promotes(registry: RegistryHarness,
                                                     tmp_path: Path) -> None:
    cid = await running(registry, tmp_path)
    for agent, stable, canary in (("gpu-1", 60, 8), ("gpu-2", 40, 6)):
        await report(registry, agent, side(cid, "stable", stable), side(cid, "canary", canary))
    await make_due(registry, cid)
    stepped = await canary_when(registry, step=2)
    assert (stepped["state"], stepped["weight"]) == ("progressing", 50)
    assert stepped["reason"] == "step 1 of 2 (10%) passed; now 50%"
    assert {c["metric"]: c["verdict"] for c in stepped["checks"]} == {
        "requests": "pass", "error_rate": "pass", "error_rate_increase": "pass",
        "latency_p95": "pass", "ttft_p95": "pass", "load_failures": "pass"}
    first = stepped["checks"][0]
    assert (first["stable_requests"], first["canary_requests"]) == (100, 14)
    assert await alias_version(registry) == 1
    # The next window holds only what came after the step: 14 canary requests are not
    # enough again, so the counts must grow.
    await report(registry, "gpu-1", side(cid, "stable", 110), side(cid, "canary", 60))
    await make_due(registry, cid)
    promoted = await canary_when(registry, state="promoted")
    assert promoted["weight"] == 100 and promoted["checks"][0]["canary"] == 52
    assert await alias_version(registry) == 2
    weights = [(e["action"], e["canary"] and e["canary"]["weight"])
               for e in await alias_events(registry)]
    assert weights[-2:] == [("canary_step", 50), ("canary_promote", None)]
    assert (await moves(registry))[:2] == [
        ("canary_promote", "canary-analysis", promoted["reason"]),
        ("canary_step", "canary-analysis", stepped["reason"])]


async def test_a_canary_answering_errors_is_rolled_back(registry: RegistryHarness,
                                                       tmp_path: Path) -> None:
    aborted = await first_step(registry, tmp_path, {"requests": 400},
                               {"requests": 100, "errors": 5}, "aborted")
    assert aborted["weight"] == 0 and aborted["step"] == 1
    assert aborted["reason"].startswith("rolled back by the analysis at step 1 of 2 (10%): "
                                        "error_rate_increase 0.05 on the canary (100 "
                                        "requests) against 0 on stable (400)")
    assert {c["metric"] for c in aborted["checks"] if c["verdict"] == "fail"} == {
        "error_rate_increase"}
    assert await alias_version(registry) == 1
    last = (await alias_events(registry))[-1]
    assert (last["action"], last["canary"], last["reason"]) == (
        "canary_abort", None, aborted["reason"])
    assert (await moves(registry))[0] == ("canary_abort", "canary-analysis",
                                          aborted["reason"])


async def test_a_slow_canary_is_paused_when_asked_to(registry: RegistryHarness,
                                                    tmp_path: Path) -> None:
    paused = await first_step(registry, tmp_path, {"requests": 200, "seconds": 0.09},
                              {"requests": 50, "seconds": 0.2}, "paused", on_failure="pause")
    assert paused["weight"] == 10
    assert paused["reason"].startswith("paused by the analysis at step 1 of 2 (10%): "
                                       "latency_p95 ")
    assert {c["metric"] for c in paused["checks"] if c["verdict"] == "fail"} == {
        "latency_p95", "ttft_p95"}
    # Held: a paused canary is not judged, however long it waits.
    await make_due(registry, paused["id"])
    analyst = registry.ctx.analyst
    assert analyst is not None and await analyst.tick() == []
    assert await alias_version(registry) == 1


async def test_a_canary_without_traffic_never_promotes(registry: RegistryHarness,
                                                      tmp_path: Path) -> None:
    cid = await running(registry, tmp_path, analysis={**ANALYSIS, "inconclusive_limit": 1})
    await make_due(registry, cid)
    watched = await canary_when(registry, reason=(
        "step 1 of 2 (10%) watched again (1 of 1 allowed): inconclusive 1 step(s) in a "
        "row (requests, error_rate, error_rate_increase, latency_p95, ttft_p95): fewer "
        "than 10 requests on a version"))
    assert (watched["state"], watched["step"]) == ("progressing", 1)
    await report(registry, "gpu-1", side(cid, "stable", 500), side(cid, "canary", 3))
    await make_due(registry, cid)
    aborted = await canary_when(registry, state="aborted")
    assert "inconclusive 2 step(s) in a row" in aborted["reason"]
    assert await alias_version(registry) == 1


async def test_a_canary_that_failed_to_load_fails(registry: RegistryHarness,
                                                 tmp_path: Path) -> None:
    aborted = await first_step(registry, tmp_path, {"requests": 100},
                               {"requests": 0, "load_failures": 1}, "aborted")
    assert "load_failures 1 on the canary" in aborted["reason"]


async def test_an_agent_that_restarted_keeps_its_window(registry: RegistryHarness,
                                                       tmp_path: Path) -> None:
    cid = await running(registry, tmp_path)
    await report(registry, "gpu-1", side(cid, "stable", 100), side(cid, "canary", 30))
    await make_due(registry, cid)
    await canary_when(registry, step=2)
    await report(registry, "gpu-1", side(cid, "stable", 150), side(cid, "canary", 45))
    # Restarted: its counts begin again, and add to the 50 and 15 of this window.
    await report(registry, "gpu-1", side(cid, "stable", 7), side(cid, "canary", 2))
    await make_due(registry, cid)
    done = await canary_when(registry, state="promoted")
    assert (done["checks"][0]["stable"], done["checks"][0]["canary"]) == (57, 17)


async def test_reports_of_no_running_canary_are_kept_out(registry: RegistryHarness,
                                                        tmp_path: Path) -> None:
    cid = await running(registry, tmp_path)
    await report(registry, "gpu-1", side(cid + 1, "canary", 100, errors=100),
                 side(cid, "stable", 100), side(cid, "canary", 20))
    broken = side(cid, "canary", 5).model_dump(mode="json")
    broken["latency"] = [5] + [0] * len(TRAFFIC_BUCKETS)
    status = AgentStatus(agent_id="gpu-2", base_model=BASE_MODEL, time=utcnow(), served=[])
    response = await post_status(registry, {**status.model_dump(mode="json"),
                                            "traffic": [broken]})
    assert response.status_code == 422, response.text
    await make_due(registry, cid)
    assert (await canary_when(registry, step=2))["checks"][0]["canary"] == 20


async def test_two_analysts_judge_a_step_once(registry: RegistryHarness,
                                             tmp_path: Path) -> None:
    own = registry.ctx.analyst
    assert own is not None
    await own.stop()  # only the two below look
    cid = await running(registry, tmp_path)
    await report(registry, "gpu-1", side(cid, "stable", 100), side(cid, "canary", 20))
    first, second = (CanaryAnalyst(registry.ctx.db, interval_s=1, lease_s=60)
                     for _ in range(2))
    assert await first.tick() == []  # leased to the first; its step is not due yet
    await make_due(registry, cid)
    assert await second.tick() == []  # the first holds it
    judged = await first.tick()
    assert [(j.canary_id, j.next) for j in judged] == [(cid, "advance")]
    await report(registry, "gpu-1", side(cid, "stable", 200), side(cid, "canary", 60))
    await make_due(registry, cid)
    await first.stop()  # hands its lease back: the second goes on at once
    assert [j.next for j in await second.tick()] == ["promote"]
    steps = [e["action"] for e in await alias_events(registry)
             if e["action"].startswith("canary_")]
    assert steps == ["canary_start", "canary_step", "canary_promote"]


async def test_a_lease_left_by_a_dead_analyst_runs_out(registry: RegistryHarness,
                                                      tmp_path: Path) -> None:
    own = registry.ctx.analyst
    assert own is not None
    await own.stop()
    cid = await running(registry, tmp_path)
    await report(registry, "gpu-1", side(cid, "stable", 100), side(cid, "canary", 20))
    dead, alive = (CanaryAnalyst(registry.ctx.db, interval_s=1, lease_s=60)
                   for _ in range(2))
    await dead.tick()  # and never again, nor hands it back
    await make_due(registry, cid)
    assert await alive.tick() == []
    async with registry.ctx.db.session() as session:
        await session.execute(update(CanaryRow).where(CanaryRow.id == cid)
                              .values(analyst_until=utcnow() - timedelta(seconds=1)))
        await session.commit()
    assert [j.next for j in await alive.tick()] == ["advance"]
    _, canary = await call(registry, "GET", CANARY)
    assert canary["weight"] == 50
