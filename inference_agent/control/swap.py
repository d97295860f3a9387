"""The swap of one alias: (materialize -> (load)) -> flip -> drain -> unload.

How far the new version is taken before the flip is the reconciler's decision
(``Readiness`` in contract.py): loaded ("hot"), fetched and validated ("warm"), or only
the checks that need no download ("cold"). The swap executes it. A bad version fails
in ``apply`` before the flip, so the previous version keeps serving; a cold one that
turns out bad fails at its first request instead, while the alias already points at it
(as any on-demand load does). The drain of the old version runs as its own task: a long
stream on the old version must not hold up the next move of the same adapter.

The swap is the only writer of the route table (aliases, revisions, routing rules):
the reconciler decides what should change and calls the swap to change it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from inference_agent.control.contract import Readiness, SwapResult
from inference_agent.errors import AgentError
from inference_agent.metrics import AgentMetrics
from inference_agent.node.cache import AdapterCache
from inference_agent.node.materialize import Materializer
from inference_agent.serving.leases import Leases
from inference_agent.serving.routes import RouteTable
from inference_agent.serving.traffic import TrafficTally
from loraplane.events import CanaryRoute, RouteRule, VersionRef
from loraplane.naming import versioned_name

log = logging.getLogger(__name__)


class Swapper:
    """Applies alias moves. The work queue runs one move per adapter at a time."""

    def __init__(self, routes: RouteTable, cache: AdapterCache, leases: Leases,
                 materializer: Materializer, *, drain_timeout_s: float,
                 metrics: AgentMetrics, on_change: Callable[[], None] | None = None,
                 tally: TrafficTally | None = None) -> None:
        """``tally`` hears of the canary versions that fail to load (traffic.py)."""
        self._routes = routes
        self._cache = cache
        self._leases = leases
        self._materializer = materializer
        self.drain_timeout_s = drain_timeout_s
        self._metrics = metrics
        self.on_change = on_change
        self._drains: dict[str, asyncio.Task[None]] = {}
        # Names a move is about to flip to: a drain finishing meanwhile must keep them.
        self._preparing: set[str] = set()
        # Canary versions that failed to load here, and how often (for the reports).
        self.canary_load_failures: dict[str, int] = {}
        self._tally = tally

    def draining(self) -> set[str]:
        """Versioned names whose drain is still running."""
        return set(self._drains)

    def settling(self) -> bool:
        """A drain with no request left on its version is running: it unloads now."""
        return any(not self._leases.count(name) for name in self._drains)

    async def apply(self, adapter: str, alias: str, revision: int,
                    ref: VersionRef | None, ready: Readiness = "warm",
                    canary: CanaryRoute | None = None) -> SwapResult:
        """Apply one alias move, ``ref`` made ``ready`` first; raise (and change nothing)
        if the new version fails. ``canary`` (the alias's canary after this move) is
        made ready alike; if it fails, it is never served here and stable takes its
        share."""
        current_revision, current = self._routes.alias(adapter, alias)
        old_canary = self._routes.canary(adapter, alias)
        result = SwapResult(adapter, alias, current.version if current else None,
                            ref.version if ref else None, loaded=False, flipped=False)
        if revision <= current_revision:
            self._count(adapter, "stale")
            return result
        started = time.perf_counter()
        names = {versioned_name(adapter, r.version)
                 for r in (ref, canary.target if canary else None) if r is not None}
        self._preparing |= names
        try:
            if ref is not None:
                result.loaded = await self._prepare(ref, ready)
            servable = await self._prepare_canary(canary, ready)
            with self._metrics.stage("flip"):
                result.flipped = self._routes.set_alias(adapter, alias, revision, ref)
                if result.flipped:
                    self._routes.set_canary(adapter, alias, canary, servable=servable)
        except BaseException:
            self._count(adapter, "failed")
            raise
        finally:
            self._preparing -= names
        if not result.flipped:  # a newer move landed while this one was preparing
            self._count(adapter, "stale")
            return result
        if current is not None and (ref is None or current.version != ref.version):
            self._start_drain(versioned_name(adapter, current.version))
        if old_canary is not None and (canary is None or old_canary.target != canary.target):
            self._start_drain(versioned_name(adapter, old_canary.target.version))
        self._count(adapter, "applied")
        self._metrics.swap_seconds.labels(self._metrics.adapter(adapter)).observe(
            time.perf_counter() - started)
        # The benchmarks read this line's times (bench/agent_setup.py): keep its form.
        log.info("%s@%s: %s -> %s (revision %d, loaded=%s)", adapter, alias,
                 result.old, result.new, revision, result.loaded)
        if canary is not None or old_canary is not None:
            log.info("%s@%s: canary %s", adapter, alias,
                     f"{canary.target.version} at {canary.weight}%" if canary else "none")
        await self._evict_disk()
        self._notify()
        return result

    async def _prepare_canary(self, canary: CanaryRoute | None, ready: Readiness) -> bool:
        """Whether the canary version may be served here: made ready as the alias's own
        version is. A failure is logged and counted, never raised."""
        if canary is None or canary.weight <= 0:
            return True
        try:
            await self._prepare(canary.target, ready)
        except AgentError as exc:
            name = versioned_name(canary.target.adapter, canary.target.version)
            log.warning("canary %s failed to load here; its share goes to stable: %s",
                        name, exc.message)
            self.canary_load_failures[name] = self.canary_load_failures.get(name, 0) + 1
            if self._tally is not None:
                self._tally.load_failed(canary.id)
            return False
        return True

    def _count(self, adapter: str, outcome: str) -> None:
        self._metrics.swaps.labels(adapter=self._metrics.adapter(adapter), outcome=outcome).inc()

    def record(self, adapter: str, alias: str, revision: int, ref: VersionRef) -> None:
        """The alias moved away and back to ``ref``: same weights, only a newer revision."""
        self._routes.set_alias(adapter, alias, revision, ref)

    def drop_adapter(self, adapter: str) -> None:
        """Forget ``adapter`` entirely, so a re-created one starts from revision 0. Its
        aliases were removed first (by ``apply``), which drained its versions."""
        self._routes.drop_adapter(adapter)

    def set_rules(self, rules: list[RouteRule], keep: frozenset[str] = frozenset()) -> None:
        self._routes.set_rules(rules, keep)

    def set_rule(self, tenant: str, kind: str, key: str, rule: RouteRule | None) -> None:
        self._routes.set_rule(tenant, kind, key, rule)

    def set_owner(self, adapter: str, tenant: str) -> None:
        self._routes.set_owner(adapter, tenant)

    async def _prepare(self, ref: VersionRef, ready: Readiness) -> bool:
        """Take ``ref`` as far as ``ready`` says; whether it was loaded."""
        if ready == "hot":
            await self._cache.ensure_active(ref, record=False)  # materializes first
            return True
        if ready == "warm":
            await self._materializer.materialize(ref)
        else:
            self._materializer.precheck(ref)
        return False

    def _start_drain(self, name: str) -> None:
        if name in self._drains:
            return  # already waiting for it; its deadline stands
        task = asyncio.create_task(self._drain(name), name=f"drain {name}")
        self._drains[name] = task
        task.add_done_callback(lambda done: self._drain_done(name, done))

    def _drain_done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._drains.get(name) is task:
            # Ended without its own notice (kept, failed or cancelled): a status report
            # waiting for the drain must still hear that it is over.
            del self._drains[name]
            self._notify()
        if not task.cancelled() and task.exception() is not None:
            log.error("drain of %s failed", name, exc_info=task.exception())

    async def _drain(self, name: str) -> None:
        started = time.perf_counter()
        idle = await self._leases.wait_idle(name, self.drain_timeout_s)
        self._metrics.stage_seconds.labels(stage="drain").observe(time.perf_counter() - started)
        if self._routes.is_routed(name) or name in self._preparing:
            return  # moved back (rollback) or another alias points at it: keep it
        if not idle:
            # The design bounds a drain: vLLM finishes running requests on the weights
            # they started with even after the name is unloaded.
            log.warning("drain of %s timed out after %.0fs with %d requests in flight; "
                        "unloading", name, self.drain_timeout_s, self._leases.count(name))
        try:
            await self._cache.remove(name)
        except AgentError as exc:
            # Still in vLLM; the periodic resync unloads strays it finds there.
            log.warning("unloading %s after its drain failed: %s", name, exc.message)
        await self._evict_disk()
        # Done before the notice, so a status report it wakes no longer waits for it.
        if self._drains.get(name) is asyncio.current_task():
            del self._drains[name]
        self._notify()

    async def _evict_disk(self, *, recount: bool = False) -> None:
        keep = self._cache.in_use_names() | self._routes.routed_names() | self._preparing
        try:
            await self._materializer.evict_disk(keep, recount=recount)
        except OSError as exc:
            log.warning("disk cache eviction failed: %s", exc)

    async def recount_disk(self) -> None:
        """Walk the disk cache now and evict what it holds over budget: what changed on
        disk by other hands is seen (the periodic resync)."""
        await self._evict_disk(recount=True)

    def _notify(self) -> None:
        if self.on_change is not None:
            self.on_change()

    async def drain_all(self, timeout_s: float) -> None:
        """Shutdown: wait up to ``timeout_s`` for running drains, then cancel the rest."""
        tasks = list(self._drains.values())
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
