"""What this agent serves, reported to the registry: on change (debounced) and as a
heartbeat.

The report lists, per adapter alias, the version routed and its state: ``serving``
(routed; loaded now or at its first request), ``loading`` (a move in progress, or being
retried, with the last reason), ``draining`` (an old version waiting for its requests),
and, under ``failures``, versions marked bad on this host with the code and reason. A
registry that is down never stops the agent: the report is retried later.

One push is one report: a move marks the report dirty as it starts (``loading``), at
its flip and when the old version's drain unloads it. The post is held while a move
is still under way or an idle drain is unloading (``settling``), for at most
``settle_max_s``, so the fleet view learns the outcome in one post instead of one per
step; a change with neither under way waits out the debounce instead. A drain
waiting for requests in flight does not hold it: that report says ``draining``, and
the drain's end is reported when it comes.

Every report carries what each side of the canaries running here served
(serving/traffic.py). While a canary runs here, the reporter also looks every
``canary_report_interval_s`` whether those counts moved, and posts if they did: the
registry judges a canary from them sooner than the heartbeat would tell it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime
from typing import Literal, Protocol

from inference_agent.control.failures import VersionFailure
from inference_agent.node.interned import served_version, tier_entry
from inference_agent.serving.routes import RouteTable
from inference_agent.serving.traffic import TrafficReports, TrafficTally
from loraplane.events import (
    AgentStatus,
    CanaryTraffic,
    ServedVersion,
    Tier,
    TierEntry,
    VersionRef,
)

log = logging.getLogger(__name__)

Post = Callable[[AgentStatus], Awaitable[None]]
MAX_ENTRIES = 5000
# Why the reporter stopped waiting: the heartbeat (or a retry) is due, something the
# report shows changed, or a canary's traffic counts moved.
Woke = Literal["heartbeat", "changed", "traffic"]


class Routed(Protocol):
    """What a report reads of the route table (``RouteTable``, or a ``RoutedCopy``)."""

    def adapters(self) -> set[str]: ...

    def aliases(self, adapter: str) -> dict[str, tuple[int, VersionRef]]: ...


class RoutedCopy:
    """The route table's aliases as they were when copied, for a report built on a
    worker thread while the loop goes on moving them. Only the copy is made on the
    loop; removals are filtered out where the report is built."""

    def __init__(self, routes: RouteTable) -> None:
        self._held = routes.held_all()

    def adapters(self) -> set[str]:
        return {adapter for adapter, table in self._held.items()
                if any(ref is not None for _revision, ref in table.values())}

    def aliases(self, adapter: str) -> dict[str, tuple[int, VersionRef]]:
        return {alias: (revision, ref)
                for alias, (revision, ref) in self._held.get(adapter, {}).items()
                if ref is not None}


class LoadedNames(Protocol):
    def loaded_names(self) -> list[str]: ...


class Draining(Protocol):
    def draining(self) -> set[str]: ...


class DiskTier(Protocol):
    def on_disk(self) -> AbstractSet[tuple[str, int]]: ...


class Owned(Protocol):
    def owned(self) -> set[str]: ...

    def over_capacity(self) -> set[str]: ...


def tier_entries(*, routes: Routed, loaded: Iterable[str],
                 on_disk: AbstractSet[tuple[str, int]],
                 owned: set[str], over_capacity: set[str] | None = None) -> list[TierEntry]:
    """Every version routed, loaded or on disk here, with its tier: hot (loaded in
    vLLM), warm (on disk), cold (routed but only in the blob store)."""
    hot = {parts for name in loaded if (parts := _split(name)) is not None}
    routed = {(adapter, ref.version) for adapter in routes.adapters()
              for _rev, ref in routes.aliases(adapter).values()}
    over = over_capacity or set()
    entries: list[TierEntry] = []
    for adapter, version in sorted(hot | routed | on_disk):
        tier: Tier = ("hot" if (adapter, version) in hot
                      else "warm" if (adapter, version) in on_disk else "cold")
        entries.append(tier_entry(adapter, version, tier, adapter in owned, adapter in over))
    return entries[:MAX_ENTRIES]


class FailureSource(Protocol):
    """The reconciler: versions in progress and versions that failed."""

    def failures(self) -> list[VersionFailure]: ...

    def pending(self) -> dict[tuple[str, str], int | None]: ...


def _split(name: str) -> tuple[str, int] | None:
    adapter, _, version = name.rpartition("@")
    return (adapter, int(version)) if adapter and version.isdigit() else None


def build_status(*, agent_id: str, base_model: str, routes: Routed,
                 loaded: Iterable[str], draining: Iterable[str],
                 pending: Mapping[tuple[str, str], int | None],
                 failures: Iterable[VersionFailure], now: datetime,
                 tiers: Iterable[TierEntry] = (),
                 traffic: Iterable[CanaryTraffic] = ()) -> AgentStatus:
    served: list[ServedVersion] = []
    for adapter in sorted(routes.adapters()):
        for alias, (_revision, ref) in sorted(routes.aliases(adapter).items()):
            served.append(served_version(adapter, alias, ref.version, "serving"))
    for (adapter, alias), version in sorted(pending.items()):
        if version is not None:
            served.append(served_version(adapter, alias, version, "loading"))
    for name in sorted(set(draining)):
        parts = _split(name)
        if parts is not None:
            served.append(served_version(parts[0], None, parts[1], "draining"))
    bad: list[ServedVersion] = []
    for failure in failures:
        entry = ServedVersion(adapter=failure.adapter, alias=failure.alias,
                              version=failure.version,
                              state="failed" if failure.bad else "loading",
                              reason=failure.reason[:1000], code=failure.code)
        (bad if failure.bad else served).append(entry)
    served = _unique(served)
    return AgentStatus(agent_id=agent_id, base_model=base_model, time=now,
                       served=served[:MAX_ENTRIES], loaded=sorted(loaded)[:MAX_ENTRIES],
                       failures=bad[:MAX_ENTRIES], tiers=list(tiers), traffic=list(traffic))


def _unique(entries: list[ServedVersion]) -> list[ServedVersion]:
    # A move being retried is both "pending" and a failure; the one with a reason wins.
    best: dict[tuple[str, str | None, int, str], ServedVersion] = {}
    for entry in entries:
        key = (entry.adapter, entry.alias, entry.version, entry.state)
        if key not in best or entry.reason is not None:
            best[key] = entry
    return list(best.values())


class StatusReporter:
    """Posts the agent's status when it changes (debounced) and every heartbeat."""

    def __init__(self, *, agent_id: str, base_model: str, routes: RouteTable,
                 cache: LoadedNames, swapper: Draining, sources: Iterable[FailureSource],
                 post: Post, heartbeat_interval_s: float, debounce_s: float = 0.1,
                 retry_s: float = 5.0, disk: DiskTier | None = None,
                 owned: Owned | None = None, settling: Callable[[], bool] | None = None,
                 settle_max_s: float = 5.0, tally: TrafficTally | None = None,
                 canary_report_interval_s: float = 5.0) -> None:
        self.agent_id = agent_id
        self.base_model = base_model
        self._routes = routes
        self._cache = cache
        self._swapper = swapper
        self._sources = list(sources)
        self._post = post
        self._disk = disk
        self._owned = owned
        self.heartbeat_interval_s = heartbeat_interval_s
        self.debounce_s = debounce_s
        self.retry_s = retry_s
        self._settling = settling
        self.settle_max_s = settle_max_s
        self._traffic = (TrafficReports(tally, routes, canary_report_interval_s)
                         if tally is not None else None)
        self._dirty = asyncio.Event()
        self._last_sent: AgentStatus | None = None
        self._failing = False
        self._leaving = False
        self._holding = False
        self.posted = 0

    @property
    def holding(self) -> bool:
        """A report is being held until a move or an idle drain ends."""
        return self._holding

    def changed(self) -> None:
        """Something the report shows changed: post soon (many changes, one post)."""
        self._dirty.set()

    def build(self) -> AgentStatus:
        return self._taken()()

    def _taken(self) -> Callable[[], AgentStatus]:
        """Copies of what the report shows, taken now; the function returned builds the
        report from those copies alone, so that it runs on a worker thread: with
        thousands of entries, building and comparing it would hold the loop."""
        pending: dict[tuple[str, str], int | None] = {}
        failures: list[VersionFailure] = []
        for source in self._sources:
            pending.update(source.pending())
            failures.extend(source.failures())
        loaded = list(self._cache.loaded_names())
        on_disk = frozenset(self._disk.on_disk()) if self._disk else frozenset()
        owned = set(self._owned.owned()) if self._owned else set()
        over = set(self._owned.over_capacity()) if self._owned else set()
        routed, draining = RoutedCopy(self._routes), set(self._swapper.draining())
        traffic = self._traffic.take() if self._traffic is not None else []
        leaving, now = self._leaving, datetime.now(UTC)

        def assemble() -> AgentStatus:
            tiers = tier_entries(routes=routed, loaded=loaded, on_disk=on_disk,
                                 owned=owned, over_capacity=over)
            status = build_status(agent_id=self.agent_id, base_model=self.base_model,
                                  routes=routed, loaded=loaded, draining=draining,
                                  pending=pending, failures=failures, now=now, tiers=tiers,
                                  traffic=traffic)
            return status.model_copy(update={"leaving": True}) if leaving else status
        return assemble

    async def leave(self) -> bool:
        """Tell the registry this agent is shutting down, so the fleet re-places without
        waiting for the staleness window; every later report says so too."""
        self._leaving = True
        return await self.report(force=True)

    async def run(self) -> None:
        """Post the first report at once, then on change and every heartbeat (and while
        a canary runs here, when its counts moved: ``_wait``)."""
        force = True
        while True:
            ok = await self.report(force=force)
            wait_s = self.heartbeat_interval_s
            if not ok:
                wait_s = min(self.retry_s, wait_s)
            woke = await self._wait(wait_s)
            if woke == "heartbeat":
                force = True  # a heartbeat (or a retry): post even if nothing changed
                continue
            # Let a burst of changes (a swap touches several) settle into one post: while
            # a move or an idle drain is under way, by waiting for their notices; else
            # by the debounce timer (a wake-up fewer per push when a move comes first).
            # Traffic alone comes as no burst: no debounce, but a move still holds it.
            if woke == "changed" and not self._busy():
                await asyncio.sleep(self.debounce_s)
            await self._settle()
            force = not ok

    async def _wait(self, wait_s: float) -> Woke:
        """Wait up to ``wait_s`` for a change; while a canary runs here, look every
        ``canary_report_interval_s`` whether the traffic counts moved since the last
        report, and end the wait if they did."""
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            poll_s = self._traffic.poll_s() if self._traffic is not None else None
            try:
                async with asyncio.timeout(left if poll_s is None else min(left, poll_s)):
                    await self._dirty.wait()
                return "changed"
            except TimeoutError:
                if (self._traffic is not None and self._traffic.news()
                        and time.monotonic() < deadline):
                    return "traffic"
        return "heartbeat"

    def _busy(self) -> bool:
        """A move under way, or an idle drain unloading: the report would change soon."""
        if any(source.pending() for source in self._sources):
            return True
        return self._settling is not None and self._settling()

    async def _settle(self) -> None:
        # A move ending and a drain ending both call ``changed()``, so this sleeps until
        # one does, with no timer of its own: on a host of a hundred agents each wake-up
        # is a context switch onto a cold cache. The deadline bounds a wait whose end
        # was never told. ``_busy`` and ``clear`` run with no await between them, so a
        # change cannot fall between the check and the wait.
        deadline = time.monotonic() + self.settle_max_s
        try:
            while self._busy() and (left := deadline - time.monotonic()) > 0:
                self._dirty.clear()
                self._holding = True
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._dirty.wait()
        finally:
            self._holding = False

    async def report(self, *, force: bool) -> bool:
        """Post the current status (skipped if unchanged and not forced); False on error.

        Building the report can fail too (listing the disk cache with no descriptor
        left: EMFILE); that is a failed report, retried like a post, never the end of
        the agent."""
        self._dirty.clear()
        try:
            status, same = await asyncio.to_thread(_built, self._taken(), self._last_sent)
            if same and not force:
                self._sent_traffic()
                return True
            await self._post(status)
        except Exception as exc:
            # The registry being down must never stop serving; say so once per outage.
            level = logging.DEBUG if self._failing else logging.WARNING
            log.log(level, "posting status failed: %s: %s", type(exc).__name__, exc)
            self._failing = True
            return False
        if self._failing:
            log.info("status reported again")
        self._failing = False
        self._last_sent = status
        self._sent_traffic()
        self.posted += 1
        return True

    def _sent_traffic(self) -> None:
        if self._traffic is not None:
            self._traffic.sent()


def _built(assemble: Callable[[], AgentStatus],
           last: AgentStatus | None) -> tuple[AgentStatus, bool]:
    """The report, and whether it says what ``last`` said (on a worker thread)."""
    status = assemble()
    return status, last is not None and _same(status, last)


def _same(a: AgentStatus, b: AgentStatus) -> bool:
    return a.model_copy(update={"time": b.time}) == b
