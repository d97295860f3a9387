"""One step of a running canary judged: the analysis' use case, one transaction.

The analyst first reads the canary as it stands (``Seen``) and calls its webhook gates
with no transaction open (they may take seconds). Then, under the alias's lock, the
canary is read again: only a progressing canary still at the step that was seen, due,
and leased to this analyst is judged, so two analysts (or one that asks twice) judge a
step once. The step's checks (its window's, and the gates') are kept on the canary;
then, as ``decide`` says, the weight advances to the next step (an event for the
agents), the alias moves to the canary version at the last, the step is watched again
(a failed one on a fresh window, an inconclusive one on its window grown by another
step), or the canary stops: ``on_failure`` rolls it back (weight 0, the alias stays) or
pauses it. Step 0 is the ``pre`` gates alone, before any traffic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.api.canaries import Canary, CanaryAnalysis, CanaryCheck
from loraplane.events import CanaryTrack
from registry_service.canaries.analysis import Decision, Next, VersionWindow, checks, decide
from registry_service.canaries.models import CanaryRow
from registry_service.canaries.service import Running, running_by_id
from registry_service.canaries.traffic import rebase, windows
from registry_service.db.base import as_utc

# The actor the analysis' transitions carry in the alias's history and the events.
ANALYST_ACTOR = "canary-analysis"


@dataclass(frozen=True)
class Judged:
    canary_id: int
    next: Next
    reason: str
    # What happened: ``next``, but a stop is named by what it did (rollback or pause).
    outcome: str


@dataclass(frozen=True)
class Seen:
    """A canary as the analyst read it before calling its gates."""

    canary: Canary
    step_started_at: datetime
    window_started_at: datetime


@dataclass(frozen=True)
class Measured:
    """What the analyst found outside the transaction: the gates' and the user's
    queries' checks, and both sides' windows when Prometheus gave them."""

    checks: Sequence[CanaryCheck] = ()
    sides: dict[CanaryTrack, VersionWindow] | None = None


def due(step: int, step_started_at: datetime, step_seconds: int, now: datetime) -> bool:
    """Step 0 (the gates before any traffic) at once; a step once its time is up."""
    return step == 0 or as_utc(step_started_at) + timedelta(seconds=step_seconds) <= now


async def seen(session: AsyncSession, canary_id: int) -> Seen | None:
    """The running canary, read without a lock (the gates are called after)."""
    canary = await running_by_id(session, canary_id, lock=False)
    was = None
    if canary is not None:
        row = canary.row
        was = Seen(canary.out(), row.step_started_at,
                   row.window_started_at or row.step_started_at)
    await session.rollback()
    return was


def _current(row: CanaryRow | None, was: Seen, analyst: str, now: datetime) -> bool:
    return (row is not None and row.state == "progressing" and row.analyst == analyst
            and row.step == was.canary.step
            and as_utc(row.step_started_at) == as_utc(was.step_started_at)
            and due(row.step, row.step_started_at, row.step_seconds, now))


async def judge(session: AsyncSession, was: Seen, measured: Measured, *,
                analyst: str, now: datetime) -> Judged | None:
    """Judge the step ``was`` saw, with what was ``measured`` outside, if it is still
    current, due and leased to ``analyst``; commits."""
    canary = await running_by_id(session, was.canary.id)
    row = canary.row if canary is not None else None
    if canary is None or row is None or not _current(row, was, analyst, now):
        await session.rollback()
        return None
    analysis = CanaryAnalysis(**row.analysis)
    step = list(measured.checks)
    if row.step > 0:
        sides = _merged(await windows(session, row.id), measured.sides)
        step = checks(sides["stable"], sides["canary"], analysis) + step
    decision = decide(step, last_step=row.step >= len(row.steps), failures=row.failures,
                      inconclusive=row.inconclusive, analysis=analysis)
    row.checks = [check.model_dump() for check in step]
    row.failures, row.inconclusive = decision.failures, decision.inconclusive
    reason = await _apply(canary, decision, analysis, now)
    outcome = decision.next if decision.next != "stop" else (
        "rollback" if row.on_failure == "rollback" else "pause")
    await session.commit()
    return Judged(row.id, decision.next, reason, outcome)


def _merged(reported: dict[CanaryTrack, VersionWindow],
            prometheus: dict[CanaryTrack, VersionWindow] | None
            ) -> dict[CanaryTrack, VersionWindow]:
    """Prometheus' windows when it gave them, with the load failures agents reported
    (Prometheus has no series of them per canary version)."""
    if prometheus is None:
        return reported
    return {track: replace(window, load_failures=reported[track].load_failures)
            for track, window in prometheus.items()}


def _where(row: CanaryRow) -> str:
    if row.step == 0:
        return "the gates before the first step"
    return f"step {row.step} of {len(row.steps)} ({row.weight}%)"


async def _apply(canary: Running, decision: Decision, analysis: CanaryAnalysis,
                 now: datetime) -> str:
    row = canary.row
    at = _where(row)
    if decision.next == "promote":
        reason = f"promoted by the analysis: every step passed, the last at {row.weight}%"
        await canary.promote(ANALYST_ACTOR, reason)
        return reason
    if decision.next == "stop":
        return _stop(canary, f"{at}: {decision.reason}")
    if decision.next == "advance":
        weight = row.steps[row.step]
        row.reason = f"{at} passed; now {weight}%"
        row.step, row.weight = row.step + 1, weight
        canary.record("canary_step", ANALYST_ACTOR, row.reason, canary.route())
    else:  # retry a failed step, or watch an inconclusive one again
        count, bound = ((decision.failures, analysis.failure_limit)
                        if decision.next == "retry"
                        else (decision.inconclusive, analysis.inconclusive_limit))
        row.reason = f"{at} watched again ({count} of {bound} allowed): {decision.reason}"
        row.updated_at = now
    row.step_started_at = now
    if decision.next != "extend":  # too few requests: the window goes on growing
        row.window_started_at = now
        await rebase(canary.session, row.id)
    return row.reason


def _stop(canary: Running, why: str) -> str:
    row = canary.row
    if row.on_failure == "rollback":
        reason = f"rolled back by the analysis at {why}"
        canary.abort(ANALYST_ACTOR, reason)
        return reason
    row.state = "paused"
    row.reason = f"paused by the analysis at {why}"
    canary.record("canary_pause", ANALYST_ACTOR, row.reason, canary.route())
    return row.reason
