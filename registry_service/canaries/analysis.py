"""Judging one step of a canary: measure, assess, decide (Argo Rollouts' analysis).

``checks`` compares the canary version with the stable one on the same window, one
``CanaryCheck`` per metric; ``assess`` folds them into the step's verdict (any failure
fails it; otherwise anything inconclusive makes it inconclusive); ``decide`` counts
failed and inconclusive steps against the analysis' limits and says what happens next.
Too few requests never pass a check: inconclusive never promotes. Time to the first
token exists for streamed requests only: with enough requests and none streamed on
either side, that check is left out rather than held inconclusive for ever.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from loraplane.api.canaries import CanaryAnalysis, CanaryCheck, Verdict

# (upper bound in seconds, cumulative count), ascending, the last bound +Inf.
Buckets = Sequence[tuple[float, int]]


@dataclass(frozen=True)
class VersionWindow:
    """What one version did over the step's window, across the fleet."""

    requests: int = 0
    errors: int = 0  # the agents' and vLLM's 5xx, and timeouts
    latency: Buckets = ()
    ttft: Buckets = ()
    load_failures: int = 0


def quantile(q: float, buckets: Buckets) -> float | None:
    """Prometheus' ``histogram_quantile``: linear within the bucket the rank falls in,
    the highest finite bound for a rank in +Inf; None without observations."""
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def _rate(window: VersionWindow) -> float | None:
    return window.errors / window.requests if window.requests else None


def _check(metric: str, stable: float | None, canary: float | None, threshold: float,
           sides: tuple[VersionWindow, VersionWindow], verdict: Verdict) -> CanaryCheck:
    return CanaryCheck(metric=metric, stable=stable, canary=canary, threshold=threshold,
                       stable_requests=sides[0].requests, canary_requests=sides[1].requests,
                       verdict=verdict)


def checks(stable: VersionWindow, canary: VersionWindow,
           analysis: CanaryAnalysis) -> list[CanaryCheck]:
    """Every check of one step, canary against stable on the same window."""
    sides = (stable, canary)
    enough = canary.requests >= analysis.min_requests
    compared = enough and stable.requests >= analysis.min_requests
    out = [_check("requests", stable.requests, canary.requests, analysis.min_requests, sides,
                  "pass" if enough else "inconclusive")]
    rate_s, rate_c = _rate(stable), _rate(canary)
    out.append(_check("error_rate", rate_s, rate_c, analysis.max_error_rate, sides,
                      _at_most(rate_c, analysis.max_error_rate, enough)))
    limit = None if rate_s is None else rate_s + analysis.max_error_rate_increase
    out.append(_check("error_rate_increase", rate_s, rate_c,
                      analysis.max_error_rate_increase if limit is None else limit, sides,
                      _at_most(rate_c, limit, compared)))
    for metric, ratio, side in (("latency_p95", analysis.max_latency_p95_ratio, "latency"),
                                ("ttft_p95", analysis.max_ttft_p95_ratio, "ttft")):
        value_s = quantile(0.95, getattr(stable, side))
        value_c = quantile(0.95, getattr(canary, side))
        if side == "ttft" and value_s is None and value_c is None and compared:
            continue  # no request streamed on either side: nothing to compare
        bound = None if value_s is None else value_s * ratio
        out.append(_check(metric, value_s, value_c, ratio if bound is None else bound, sides,
                          _at_most(value_c, bound, compared)))
    out.append(_check("load_failures", stable.load_failures, canary.load_failures,
                      analysis.max_load_failures, sides,
                      "pass" if canary.load_failures <= analysis.max_load_failures
                      else "fail"))
    return out


def _at_most(value: float | None, limit: float | None, enough: bool) -> Verdict:
    if not enough or value is None or limit is None:
        return "inconclusive"
    return "pass" if value <= limit else "fail"


def assess(step: Sequence[CanaryCheck]) -> Verdict:
    """The step's verdict: failed if any check failed, else inconclusive if any was."""
    verdicts = {check.verdict for check in step}
    if "fail" in verdicts:
        return "fail"
    return "inconclusive" if "inconclusive" in verdicts else "pass"


Next = Literal["advance", "promote", "retry", "extend", "stop"]


@dataclass(frozen=True)
class Decision:
    """What the step's verdict leads to. ``stop`` hands over to ``on_failure``."""

    next: Next
    failures: int  # failed steps so far, this one included
    inconclusive: int  # inconclusive steps in a row, this one included
    reason: str = ""
    failed: list[CanaryCheck] = field(default_factory=list)


def decide(step: Sequence[CanaryCheck], *, last_step: bool, failures: int,
           inconclusive: int, analysis: CanaryAnalysis) -> Decision:
    """Advance (or promote at the last step) on a pass; on a failure, try the step
    again while within ``failure_limit``, else stop; on an inconclusive step, watch it
    again while within ``inconclusive_limit``, else stop."""
    verdict = assess(step)
    if verdict == "pass":
        return Decision("promote" if last_step else "advance", failures, 0)
    if verdict == "fail":
        failed = [check for check in step if check.verdict == "fail"]
        reason = "; ".join(describe(check) for check in failed)
        count = failures + 1
        return Decision("stop" if count > analysis.failure_limit else "retry", count, 0,
                        reason, failed)
    count = inconclusive + 1
    short = [check for check in step if check.verdict == "inconclusive"]
    said = [check.detail for check in short if check.detail is not None]
    why = "; ".join(said) if said else (f"fewer than {analysis.min_requests} requests on "
                                        "a version")
    reason = (f"inconclusive {count} step(s) in a row "
              f"({', '.join(check.metric for check in short)}): {why}")
    return Decision("stop" if count > analysis.inconclusive_limit else "extend", failures,
                    count, reason)


def describe(check: CanaryCheck) -> str:
    """A failed check in words an operator acts on."""
    if check.detail is not None:
        return check.detail
    return (f"{check.metric} {_num(check.canary)} on the canary ({check.canary_requests} "
            f"requests) against {_num(check.stable)} on stable ({check.stable_requests}); "
            f"the limit is {_num(check.threshold)}")


def _num(value: float | None) -> str:
    return "none" if value is None else f"{value:.4g}"
