"""The analysis of one step: each check's verdict from both versions' windows, the
step's verdict, and what it leads to within the failure and inconclusive limits."""

from __future__ import annotations

import math

import pytest

from loraplane.api.canaries import CanaryAnalysis
from registry_service.canaries.analysis import (
    VersionWindow,
    assess,
    checks,
    decide,
    describe,
    quantile,
)

INF = math.inf
DEFAULTS = CanaryAnalysis(min_requests=100)


def _latency(fast: int, slow: int) -> list[tuple[float, int]]:
    """``fast`` requests in (0, 0.1] s and ``slow`` in (0.1, 0.2] s."""
    return [(0.1, fast), (0.2, fast + slow), (INF, fast + slow)]


def _window(requests: int, errors: int = 0, slow: float = 0.0,
            load_failures: int = 0) -> VersionWindow:
    hist = _latency(requests - round(requests * slow), round(requests * slow))
    return VersionWindow(requests, errors, hist, hist, load_failures)


def _verdicts(stable: VersionWindow, canary: VersionWindow,
              analysis: CanaryAnalysis = DEFAULTS) -> dict[str, str]:
    return {c.metric: c.verdict for c in checks(stable, canary, analysis)}


def test_a_healthy_canary_passes_every_check() -> None:
    verdicts = _verdicts(_window(400), _window(120))
    assert verdicts == dict.fromkeys(("requests", "error_rate", "error_rate_increase",
                                      "latency_p95", "ttft_p95", "load_failures"), "pass")
    assert decide(checks(_window(400), _window(120), DEFAULTS), last_step=False,
                  failures=0, inconclusive=0, analysis=DEFAULTS).next == "advance"


def test_ttft_is_left_out_when_no_request_streamed() -> None:
    verdicts = _verdicts(VersionWindow(400, 0, _latency(400, 0), ()),
                         VersionWindow(120, 0, _latency(120, 0), ()))
    assert "ttft_p95" not in verdicts and set(verdicts.values()) == {"pass"}
    # With too few requests, it is kept, inconclusive, like every other.
    few = _verdicts(VersionWindow(400, 0, _latency(400, 0), ()),
                    VersionWindow(12, 0, _latency(12, 0), ()))
    assert few["ttft_p95"] == "inconclusive"
    # One side streamed, the other not: nothing to compare, inconclusive.
    one = _verdicts(VersionWindow(400, 0, _latency(400, 0), _latency(400, 0)),
                    VersionWindow(120, 0, _latency(120, 0), ()))
    assert one["ttft_p95"] == "inconclusive"


def test_errors_fail_absolute_and_relative() -> None:
    # 5 % errors against 0 %: over the increase allowed (1 %), at the absolute limit (5 %).
    verdicts = _verdicts(_window(400), _window(200, errors=10))
    assert verdicts["error_rate_increase"] == "fail" and verdicts["error_rate"] == "pass"
    assert _verdicts(_window(400), _window(200, errors=12))["error_rate"] == "fail"
    step = checks(_window(400), _window(200, errors=10), DEFAULTS)
    decision = decide(step, last_step=False, failures=0, inconclusive=0, analysis=DEFAULTS)
    assert decision.next == "stop" and [c.metric for c in decision.failed] == [
        "error_rate_increase"]
    assert decision.reason == ("error_rate_increase 0.05 on the canary (200 requests) "
                               "against 0 on stable (400); the limit is 0.01")


def test_a_slower_canary_fails_latency_and_ttft() -> None:
    # Every canary request in (0.1, 0.2] s: p95 0.195 s against 0.095 s.
    slow = _verdicts(_window(400), _window(200, slow=1.0))
    assert slow["latency_p95"] == "fail" and slow["ttft_p95"] == "fail"
    check = next(c for c in checks(_window(400), _window(200, slow=1.0), DEFAULTS)
                 if c.metric == "latency_p95")
    assert check.stable == pytest.approx(0.095) and check.canary == pytest.approx(0.195)
    assert check.threshold == pytest.approx(0.095 * 1.25)


def test_too_few_requests_are_inconclusive_and_never_promote() -> None:
    verdicts = _verdicts(_window(400), _window(99))
    assert verdicts["requests"] == "inconclusive"
    assert {verdicts[m] for m in ("error_rate", "latency_p95", "ttft_p95")} == {
        "inconclusive"}
    # Enough on the canary but not on stable: the comparisons cannot be made.
    assert _verdicts(_window(50), _window(150))["latency_p95"] == "inconclusive"
    step = checks(_window(400), _window(0), DEFAULTS)
    assert assess(step) == "inconclusive"
    for inconclusive in range(DEFAULTS.inconclusive_limit):
        decision = decide(step, last_step=True, failures=0, inconclusive=inconclusive,
                          analysis=DEFAULTS)
        assert decision.next == "extend" and decision.inconclusive == inconclusive + 1
    last = decide(step, last_step=True, failures=0,
                  inconclusive=DEFAULTS.inconclusive_limit, analysis=DEFAULTS)
    assert last.next == "stop" and "fewer than 100 requests" in last.reason


def test_load_failures_fail_whatever_the_traffic() -> None:
    assert _verdicts(_window(0), _window(0, load_failures=1))["load_failures"] == "fail"
    tolerant = CanaryAnalysis(min_requests=100, max_load_failures=2)
    assert _verdicts(_window(0), _window(0, load_failures=2), tolerant)["load_failures"] == \
        "pass"


def test_the_failure_limit_allows_that_many_failed_steps() -> None:
    analysis = CanaryAnalysis(min_requests=100, failure_limit=2)
    step = checks(_window(400), _window(200, errors=40), analysis)
    nexts = [decide(step, last_step=False, failures=n, inconclusive=0,
                    analysis=analysis).next for n in range(3)]
    assert nexts == ["retry", "retry", "stop"]
    good = checks(_window(400), _window(200), analysis)
    assert decide(good, last_step=True, failures=2, inconclusive=1,
                  analysis=analysis).next == "promote"


def test_quantile_interpolates_as_prometheus_does() -> None:
    assert quantile(0.95, []) is None and quantile(0.95, [(INF, 0)]) is None
    assert quantile(0.5, [(0.1, 50), (0.2, 100), (INF, 100)]) == pytest.approx(0.1)
    assert quantile(0.75, [(0.1, 50), (0.2, 100), (INF, 100)]) == pytest.approx(0.15)
    assert quantile(0.99, [(0.1, 1), (INF, 100)]) == pytest.approx(0.1)


def test_a_failed_check_reads_as_words() -> None:
    [check] = [c for c in checks(_window(0), _window(0, load_failures=3), DEFAULTS)
               if c.verdict == "fail"]
    assert describe(check) == ("load_failures 3 on the canary (0 requests) against 0 on "
                               "stable (0); the limit is 0")
