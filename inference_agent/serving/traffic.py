"""What each side of a running canary served here, for the registry's analysis.

The proxy counts every request an alias under canary sent to either side (``Target``'s
``canary``): requests, errors (answered 5xx: vLLM's, or the agent's own, timeouts
included), latency to the last byte and to the first streamed chunk in the fixed
``TRAFFIC_BUCKETS``; the swap counts the canary version's load failures. Each count
is cumulative since the canary was first counted here, as a Prometheus counter is
(loraplane/events.py, ``CanaryTraffic``). The status reporter sends a snapshot with
every report (``TrafficReports``), and posts sooner than its heartbeat while a canary
runs here and the counts moved.

Everything runs on the event loop: no lock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Set as AbstractSet
from itertools import accumulate

from inference_agent.serving.routes import CanarySide, RouteTable
from loraplane.events import MAX_TRAFFIC_ENTRIES, TRAFFIC_BUCKETS, CanaryTraffic

_BUCKETS = len(TRAFFIC_BUCKETS) + 1  # +Inf last


def bucket_of(seconds: float) -> int:
    """The index of the first bucket whose upper bound is >= ``seconds`` (+Inf last)."""
    return bisect_left(TRAFFIC_BUCKETS, seconds)


class _Side:
    """One side's counts; latency and TTFT per bucket (made cumulative at snapshot)."""

    __slots__ = ("errors", "latency", "load_failures", "requests", "ttft")

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.load_failures = 0
        self.latency = [0] * _BUCKETS
        self.ttft = [0] * _BUCKETS

    def report(self, key: CanarySide) -> CanaryTraffic:
        return CanaryTraffic(canary_id=key[0], track=key[1], requests=self.requests,
                             errors=self.errors, latency=list(accumulate(self.latency)),
                             ttft=list(accumulate(self.ttft)),
                             load_failures=self.load_failures)


class TrafficTally:
    """Per (canary id, side) counts of the requests this agent served. ``version``
    grows with every count, so a reader can tell cheaply whether there is news."""

    def __init__(self, max_entries: int = MAX_TRAFFIC_ENTRIES) -> None:
        self.max_entries = max_entries
        self._sides: dict[CanarySide, _Side] = {}
        self._version = 0

    @property
    def version(self) -> int:
        """Bumped by every ``record``, ``first_token`` and ``load_failed``."""
        return self._version

    def _side(self, key: CanarySide) -> _Side:
        side = self._sides.get(key)
        if side is None:
            side = self._sides[key] = _Side()
        self._version += 1
        return side

    def record(self, key: CanarySide, status: int, seconds: float) -> None:
        """A request answered with ``status`` after ``seconds`` (to its last byte)."""
        side = self._side(key)
        side.requests += 1
        if status >= 500:
            side.errors += 1
        side.latency[bucket_of(seconds)] += 1

    def first_token(self, key: CanarySide, seconds: float) -> None:
        """A streamed request's first chunk, ``seconds`` after the request arrived."""
        self._side(key).ttft[bucket_of(seconds)] += 1

    def load_failed(self, canary_id: int) -> None:
        """The canary's version failed to load here (its ``canary`` side counts it)."""
        self._side((canary_id, "canary")).load_failures += 1

    def snapshot(self, active: AbstractSet[int]) -> list[CanaryTraffic]:
        """Every side of the canaries in ``active`` (those still running here), at most
        ``max_entries``, by canary id (a canary's two sides together); the counts of any
        other canary are forgotten."""
        for key in [key for key in self._sides if key[0] not in active]:
            del self._sides[key]
        keys = sorted(self._sides)[:self.max_entries]
        return [self._sides[key].report(key) for key in keys]


class TrafficReports:
    """What the status reporter reads of the tally: a snapshot for each report, and
    whether the tally moved since the last report sent (``news``), polled every
    ``interval_s`` while a canary runs here (``poll_s``)."""

    def __init__(self, tally: TrafficTally, routes: RouteTable, interval_s: float) -> None:
        self.tally = tally
        self.interval_s = interval_s
        self._routes = routes
        self._taken = tally.version
        self._sent = tally.version

    def take(self) -> list[CanaryTraffic]:
        """The snapshot for a report being built now (on the loop)."""
        self._taken = self.tally.version
        return self.tally.snapshot(self._routes.canary_ids())

    def sent(self) -> None:
        """The report last taken was posted (or said what the last one did)."""
        self._sent = self._taken

    def news(self) -> bool:
        return self.tally.version != self._sent

    def poll_s(self) -> float | None:
        """How often to look for news: ``interval_s`` while a canary runs here."""
        return self.interval_s if self._routes.canary_ids() else None
