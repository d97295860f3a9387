"""One step of a running canary judged: the analysis' use case, one transaction.

Under the alias's lock the canary is read again: only a progressing canary whose step
is due, and whose lease this analyst holds, is judged, so two analysts (or one that
asks twice) judge a step once. The step's checks are kept on the canary; then, as
``decide`` says, the weight advances to the next step (an event for the agents), the
alias moves to the canary version at the last, the step is watched again (a failed one
on a fresh window, an inconclusive one on its window grown by another step), or the
canary stops: ``on_failure`` rolls it back (weight 0, the alias stays) or pauses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.api.canaries import CanaryAnalysis
from registry_service.canaries.analysis import Decision, Next, checks, decide
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


def due(step_started_at: datetime, step_seconds: int, now: datetime) -> bool:
    return as_utc(step_started_at) + timedelta(seconds=step_seconds) <= now


async def judge(session: AsyncSession, canary_id: int, *, analyst: str,
                now: datetime) -> Judged | None:
    """Judge the canary's step if it is due and ``analyst`` holds its lease; commits."""
    canary = await running_by_id(session, canary_id)
    row = canary.row if canary is not None else None
    if (canary is None or row is None or row.state != "progressing" or row.analyst != analyst
            or not due(row.step_started_at, row.step_seconds, now)):
        await session.rollback()
        return None
    analysis = CanaryAnalysis(**row.analysis)
    sides = await windows(session, row.id)
    step = checks(sides["stable"], sides["canary"], analysis)
    decision = decide(step, last_step=row.step >= len(row.steps), failures=row.failures,
                      inconclusive=row.inconclusive, analysis=analysis)
    row.checks = [check.model_dump() for check in step]
    row.failures, row.inconclusive = decision.failures, decision.inconclusive
    reason = await _apply(canary, decision, now)
    outcome = decision.next if decision.next != "stop" else (
        "rollback" if row.on_failure == "rollback" else "pause")
    await session.commit()
    return Judged(canary_id, decision.next, reason, outcome)


async def _apply(canary: Running, decision: Decision, now: datetime) -> str:
    row = canary.row
    at = f"step {row.step} of {len(row.steps)} ({row.weight}%)"
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
        limit = CanaryAnalysis(**row.analysis)
        count, bound = ((decision.failures, limit.failure_limit) if decision.next == "retry"
                        else (decision.inconclusive, limit.inconclusive_limit))
        row.reason = f"{at} watched again ({count} of {bound} allowed): {decision.reason}"
        row.updated_at = now
    row.step_started_at = now
    if decision.next != "extend":  # too few requests: the window goes on growing
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
