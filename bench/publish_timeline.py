"""One push on one timeline: from the push being sent to the first response from the new
version, cut into parts that add up to the whole (``bench/agent_publish_to_served.py``).

Marks, all wall clock of this one machine:

- ``sent``: the bench starts sending the push request;
- ``written``: the event's own ``time``, the outbox row of the alias move, written in
  the push's transaction right before its commit (read by the bench's NATS subscriber);
- ``received``: the agent's ``event: bench@live -> N`` log line (whole milliseconds);
- ``materialized``: the agent's log line once the version's folder is in its cache;
  the fetch started ``fetch + validate`` before it (its ``stage_seconds``, per push);
- ``flipped``: the swap's log line, written in the loop step that flips the route;
  the load ended ``flip`` before it;
- ``routed``: the first request routed to the new version: the send time of the
  earliest probe the new version answered, but no earlier than the flip (a probe sent
  just before the flip reaches the agent after it);
- ``first response``: that probe's answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.agent_setup import ms
from bench.common import percentile

COLUMNS = ("p50 ms", "p95 ms", "p99 ms", "max ms", "min ms")

PARTS = (
    "push request (sent -> event written at commit)",
    "event delivery (written -> agent has it)",
    "agent reaction (event -> fetch starts)",
    "fetch",
    "validate",
    "other (materialized -> load starts)",
    "load",
    "flip",
    "flip -> first request routed",
    "routed -> first response",
)


@dataclass
class Push:
    """One measured push; times are wall clock, stage durations in seconds."""

    version: int
    sent: float
    answered: float
    first_response: float
    first_sent: float  # the send time of the earliest probe the new version answered
    stages: dict[str, float]
    stage_counts: dict[str, int]
    written: float | None = None
    bench_subscriber: float | None = None
    received: float | None = None
    materialized: float | None = None
    flipped: float | None = None
    event_delay_s: float | None = None
    # Inside the push request (bench/sched_probe.py): the registry's upload phases (ms),
    # and per process group its CPU and run-queue ms from sent to answered.
    registry_phases: dict[str, float] | None = None
    sched: dict[str, dict[str, float]] | None = None

    @property
    def total_s(self) -> float:
        return self.first_response - self.sent

    @property
    def routed(self) -> float | None:
        return None if self.flipped is None else max(self.flipped, self.first_sent)

    def parts(self) -> dict[str, float] | None:
        """The timeline split (PARTS), or None if a mark is missing."""
        if None in (self.written, self.received, self.materialized, self.flipped):
            return None
        assert self.written is not None and self.received is not None
        assert self.materialized is not None and self.flipped is not None
        fetch, validate = self.stages["fetch"], self.stages["validate"]
        load, flip = self.stages["load"], self.stages["flip"]
        fetch_started = self.materialized - fetch - validate
        routed = max(self.flipped, self.first_sent)
        values = (self.written - self.sent, self.received - self.written,
                  fetch_started - self.received, fetch, validate,
                  self.flipped - self.materialized - load - flip, load, flip,
                  routed - self.flipped, self.first_response - routed)
        return dict(zip(PARTS, values, strict=True))


def cells(values: list[float]) -> list[str]:
    """COLUMNS of ``values`` (nearest rank); with n samples, p99 is the
    ceil(0.99 n)-th smallest: the 2nd largest of 200."""
    if not values:
        return ["-"] * len(COLUMNS)
    return [ms(percentile(values, 50)), ms(percentile(values, 95)),
            ms(percentile(values, 99)), ms(max(values)), ms(min(values))]


def summarize(pushes: list[Push]) -> dict[str, Any]:
    """Rows of p50/p95/p99/min/max per part, and the pushes whose counts were odd."""
    split = [p for p in (push.parts() for push in pushes) if p is not None]
    rows: dict[str, list[str]] = {"total: push sent -> first response": cells(
        [p.total_s for p in pushes])}
    for part in PARTS:
        rows[part] = cells([s[part] for s in split])
    rows["(load finished -> first request routed)"] = cells(
        [s["flip"] + s["flip -> first request routed"] for s in split])
    rows["(push request: sent -> answered)"] = cells([p.answered - p.sent for p in pushes])
    rows["(event at the bench's own NATS subscriber, after written)"] = cells(
        [p.bench_subscriber - p.written for p in pushes
         if p.bench_subscriber is not None and p.written is not None])
    rows["(agent's event_delay_seconds, commit -> agent, mean per push)"] = cells(
        [p.event_delay_s for p in pushes if p.event_delay_s is not None])
    for stage in ("drain", "unload"):
        rows[f"({stage} of the old version, after the flip)"] = cells(
            [p.stages[stage] for p in pushes])
    rows.update(inside_rows(pushes))
    odd = [p.version for p in pushes if any(p.stage_counts[s] != 1 for s in
                                            ("fetch", "validate", "load", "flip"))]
    return {"pushes": len(pushes), "split": len(split), "rows": rows,
            "versions_with_unexpected_stage_counts": odd}


def slowest(pushes: list[Push], count: int = 5) -> list[dict[str, Any]]:
    """The slowest pushes with their split, in ms: what the tail is made of."""
    out = []
    for push in sorted(pushes, key=lambda p: p.total_s, reverse=True)[:count]:
        split = push.parts() or {}
        out.append({"version": push.version, "total_ms": round(push.total_s * 1000, 1),
                    **{k: round(v * 1000, 1) for k, v in split.items()}})
    return out


def slowest_requests(pushes: list[Push], count: int = 8) -> list[dict[str, Any]]:
    """The slowest push requests (sent -> answered), each with the registry's phases and
    the run-queue wait of every process group: what a slow push waited for."""
    out = []
    for push in sorted(pushes, key=lambda p: p.answered - p.sent, reverse=True)[:count]:
        sched = push.sched or {}
        out.append({"version": push.version,
                    "request_ms": round((push.answered - push.sent) * 1000, 1),
                    "phases_ms": push.registry_phases,
                    "run_queue_ms": {k: v["run_queue_ms"] for k, v in sched.items()},
                    "cpu_ms": {k: v["cpu_ms"] for k, v in sched.items()}})
    return out


def inside_rows(pushes: list[Push]) -> dict[str, list[str]]:
    """Per registry phase and per process group's run-queue wait, over the pushes."""
    rows: dict[str, list[str]] = {}
    phased = [p.registry_phases for p in pushes if p.registry_phases]
    for phase in (phased[0] if phased else {}):
        rows[f"(registry's {phase} phase)"] = cells([ph[phase] / 1000 for ph in phased])
    scheds = [p.sched for p in pushes if p.sched]
    for group in (scheds[0] if scheds else {}):
        rows[f"({group}: waiting for a CPU during the push request)"] = cells(
            [s[group]["run_queue_ms"] / 1000 for s in scheds])
    return rows
