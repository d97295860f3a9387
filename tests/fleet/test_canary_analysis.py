"""The canary analysis end to end, on failures made on purpose: real agents split the
traffic of 100 customers, count each side and report it; the registry's analyst judges
each step on those counts. The vLLM stand-in answers every generation and injects the
fault under test: every 20th request of the canary version failing (5 %), the canary
version slower, or its load refused. No step is made due by hand and nothing sleeps:
every wait is on a condition, with room for a loaded machine.

Latency buckets (loraplane/events.py TRAFFIC_BUCKETS) are coarse, and the analysis
interpolates within one (``quantile`` in registry_service/canaries/analysis.py): two
delays in the same bucket have the same p95. So where latency is not the subject, its
ratio is left lenient; where it is, the delays sit in different buckets.
"""

from __future__ import annotations

import time

import pytest

from devharness.load_generator import Answer
from devharness.waiting import Unexpected, eventually
from loraplane.api.canaries import Canary, CanaryAnalysis
from loraplane.canary_split import takes_canary
from tests.fleet.canaries import END_TIMEOUT_S, latest, live_version, moves
from tests.fleet.conftest import CUSTOMERS, FleetUnderTest

pytestmark = [pytest.mark.e2e]

# Latency is judged in its own test: elsewhere only errors, requests and loads judge.
LENIENT = {"max_latency_p95_ratio": 100.0, "max_ttft_p95_ratio": 100.0}
# Judged once both sides have 50 requests; until then its step is watched again.
ON_ERRORS = CanaryAnalysis(min_requests=50, inconclusive_limit=50, **LENIENT)


def failures(answers: list[Answer]) -> list[Answer]:
    return [a for a in answers if not a.ok]


async def test_a_canary_answering_errors_is_rolled_back_at_its_first_step(
        fleet: FleetUnderTest) -> None:
    name, aborted, answers = await fleet.until_aborted("errors", {2: {"error_every": 20}},
                                                       step_seconds=2, analysis=ON_ERRORS)
    v1, v2 = f"{name}@1", f"{name}@2"
    assert aborted.reason is not None, aborted
    assert aborted.reason.startswith("rolled back by the analysis at step 1 of 1 (50%): ")
    assert "error_rate_increase" in aborted.reason, aborted.reason
    failed = {c.metric: c for c in aborted.checks if c.verdict == "fail"}
    assert "error_rate_increase" in failed, aborted.checks
    check = failed["error_rate_increase"]
    # Judged as soon as both sides had min_requests: the first judged window failed.
    assert check.canary_requests >= 50 and check.stable_requests >= 50, check
    assert check.stable == 0 and check.canary is not None and 0.02 <= check.canary <= 0.1
    assert await live_version(fleet.api, name) == 1, "the alias moved"
    history = await moves(fleet.api, name)
    assert history[-1][:2] == ("canary_abort", "canary-analysis"), history
    assert all(to != 2 for action, _, to in history if action != "canary_start"), history
    # Every failure was the canary's injected 500; stable never failed.
    assert failures(answers), "no request reached the failing canary"
    assert {(a.status, a.adapter) for a in failures(answers)} == {(500, v2)}
    assert [a for a in answers if a.adapter == v1 and not a.ok] == []
    assert {a.adapter for a in answers if a.ok} == {v1, v2}


async def test_a_slower_canary_is_rolled_back_on_its_latency(fleet: FleetUnderTest) -> None:
    # +53 %: stable's answers end in the (0.1, 0.25] s bucket (p95 0.2425 s by the
    # bucket's interpolation, with 80 ms for the agent and the machine), the canary's
    # all beyond 0.25 s (p95 0.4875 s): a ratio of 2, above the default 1.25.
    name, aborted, answers = await fleet.until_aborted(
        "slow", {1: {"delay_s": 0.17}, 2: {"delay_s": 0.26}}, step_seconds=2,
        analysis=CanaryAnalysis(min_requests=50, inconclusive_limit=50))
    v1, v2 = f"{name}@1", f"{name}@2"
    assert aborted.reason is not None and "latency_p95" in aborted.reason, aborted
    verdicts = {c.metric: c.verdict for c in aborted.checks}
    assert verdicts["latency_p95"] == "fail" and verdicts["error_rate_increase"] == "pass"
    latency = next(c for c in aborted.checks if c.metric == "latency_p95")
    assert latency.stable is not None and latency.canary is not None
    assert latency.canary > 1.25 * latency.stable, latency
    assert await live_version(fleet.api, name) == 1
    assert failures(answers) == []
    assert {a.adapter for a in answers} == {v1, v2}


async def test_a_healthy_canary_promotes_through_every_step(fleet: FleetUnderTest) -> None:
    name = await fleet.make("healthy")
    v1, v2 = f"{name}@1", f"{name}@2"
    # Both sides well inside the (0.1, 0.25] s bucket: the same p95.
    for model in (v1, v2):
        fleet.fleet.standin.set_fault(model, delay_s=0.15)
    async with fleet.load(name).running() as load:
        await fleet.hot_everywhere(name, load)
        mark = time.monotonic()
        started = await fleet.api.start_canary(
            name, 2, steps=[20, 50, 80], step_seconds=2,
            analysis=CanaryAnalysis(min_requests=50, inconclusive_limit=50,
                                    max_latency_p95_ratio=1.5, max_ttft_p95_ratio=1.5))

        async def promoted() -> Canary | None:
            canary = await latest(fleet.api, name)
            if canary.state == "aborted":
                raise Unexpected(f"the healthy canary was aborted: {canary.reason}")
            return canary if canary.state == "promoted" else None

        done = await eventually(promoted, timeout_s=3 * END_TIMEOUT_S, interval_s=0.25,
                                what="the canary promoted")
        # The alias moved: every request sent once the agents heard it is served by v2.
        await eventually(lambda: load.answers[-1].adapter == v2 and load.answers[-1].ok,
                         timeout_s=60, what="v2 serving every customer")
        moved = time.monotonic()
        await eventually(lambda: len(load.since(moved)) >= 2 * len(CUSTOMERS),
                         timeout_s=60, what="every customer asking after the promotion")
        answers, after = load.since(mark), load.since(moved)
    assert done.weight == 100, done
    assert {c.verdict for c in done.checks} == {"pass"}, done.checks
    history = await moves(fleet.api, name)
    assert [(action, actor) for action, actor, _ in history][-3:] == [
        ("canary_step", "canary-analysis"), ("canary_step", "canary-analysis"),
        ("canary_promote", "canary-analysis")], history
    assert await live_version(fleet.api, name) == 2
    assert failures(answers) == []
    assert {a.adapter for a in after} == {v2}
    # While it ran, a customer on the canary at 20 % was among those at 50 and 80 %.
    first = {c for c in CUSTOMERS if takes_canary(c, started.id, 20)}
    assert first <= {c for c in CUSTOMERS if takes_canary(c, started.id, 80)}


async def test_a_canary_without_traffic_never_promotes(fleet: FleetUnderTest) -> None:
    name = await fleet.make("idle")

    async def check() -> Canary | None:
        canary = await latest(fleet.api, name)
        if canary.state == "promoted":
            raise Unexpected(f"promoted without traffic: {canary.checks}")
        return canary if canary.state == "aborted" else None

    await fleet.api.start_canary(name, 2, steps=[50], step_seconds=1,
                                 analysis=CanaryAnalysis(min_requests=10, inconclusive_limit=2))
    aborted = await eventually(check, timeout_s=END_TIMEOUT_S, interval_s=0.25,
                               what="the idle canary stopped")
    assert aborted.weight == 0
    assert aborted.reason is not None and "inconclusive 3 step(s) in a row" in aborted.reason
    assert {c.metric: c.verdict for c in aborted.checks}["requests"] == "inconclusive"
    assert await live_version(fleet.api, name) == 1


async def test_a_canary_that_fails_to_load_is_rolled_back_and_stable_serves_its_share(
        fleet: FleetUnderTest) -> None:
    # A long step: every customer asks while the canary holds its 50 %.
    name, aborted, answers = await fleet.until_aborted(
        "unloadable", {2: {"load_status": 500}}, step_seconds=8, analysis=ON_ERRORS)
    assert aborted.reason is not None and "load_failures" in aborted.reason, aborted
    loads = next(c for c in aborted.checks if c.metric == "load_failures")
    assert loads.verdict == "fail" and loads.canary is not None and loads.canary >= 1, loads
    assert await live_version(fleet.api, name) == 1
    # The customers the split gave the canary were served, by stable, without a failure.
    assert failures(answers) == []
    assert {a.adapter for a in answers} == {f"{name}@1"}
    chosen = {c for c in CUSTOMERS if takes_canary(c, aborted.id, 50)}
    while_running = {a.customer for a in answers
                     if a.sent_wall < aborted.updated_at.timestamp()}
    assert chosen and chosen <= while_running, chosen - while_running
    state = fleet.fleet.standin.state()
    assert not any(c["name"] == f"{name}@2" for c in state["calls"]), "v2 loaded somewhere"
