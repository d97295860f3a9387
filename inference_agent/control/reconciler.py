"""The reconcile loop: desired state (the registry, the watched folder) against actual
state (route table, vLLM).

The agent has one loop: every key (see keys.py) goes through the one work queue to
``reconcile``, so failures, retries, backoff, "marked bad" and the status they feed
exist once. Keys are adapter names (desired state from the registry), ``local/<name>``
(a ``--watch-dir`` folder, read by the WatchDirSource), and special keys: ``*routes*``
(routing rules changed), ``*all*`` (full resync: re-read everything, re-check every
adapter, repair vLLM) and ``*vllm*`` (repair vLLM only). The reconciler decides; every
change to what is served is made by the swap (``AliasApplier``).

Events are hints. What the registry wants is kept in a ``DesiredMirror`` (mirror.py):
a full resync fills it, an event that can be trusted (the next revision of an alias)
updates it, anything else drops the adapter's entry so its reconcile reads that adapter
alone, and a duplicate or late event changes nothing. A snapshot's entry is not taken
for an adapter anything happened to since the snapshot read started.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from inference_agent.control.contract import AliasApplier, Readiness
from inference_agent.control.failures import Failures, VersionFailure
from inference_agent.control.keys import ALL, CREDENTIALS, ROUTES, VLLM, key_for, local_adapter
from inference_agent.control.mirror import MISSING, DesiredMirror
from inference_agent.control.placement import Placement
from inference_agent.control.route_sync import RouteSync
from inference_agent.control.watchdir import LOCAL_ALIAS, LocalVersion
from inference_agent.control.workqueue import Done, Failed, Outcome, Retry, WorkQueue
from inference_agent.errors import AgentError, RetryableError, TerminalError
from inference_agent.metrics import AgentMetrics
from inference_agent.serving.routes import RouteTable
from loraplane.events import (
    AdapterUpdated,
    CanaryRoute,
    DesiredAdapter,
    DesiredAlias,
    DesiredState,
    Event,
    FleetChanged,
    RouteChanged,
    VersionRef,
)
from loraplane.naming import parse_model_ref, versioned_name

log = logging.getLogger(__name__)


class DesiredReader(Protocol):
    async def desired(self, base_model: str, adapter: str | None = None) -> DesiredState: ...


class CacheControl(Protocol):
    def pin(self, adapter: str) -> None: ...

    def unpin(self, adapter: str) -> None: ...

    def is_pinned(self, adapter: str) -> bool: ...

    def is_active(self, name: str) -> bool: ...

    async def ensure_active(self, ref: VersionRef) -> str: ...

    async def resync(self) -> set[str]: ...


class LocalSource(Protocol):
    """The watched folder (``WatchDirSource``): which names it owns, what a folder holds,
    and the tenant its adapters belong to."""

    tenant: str

    def owns(self, adapter: str) -> bool: ...

    def release(self, adapter: str) -> None: ...

    async def read(self, adapter: str, current: VersionRef | None) -> LocalVersion | None: ...

    async def copy_in(self, ref: VersionRef, local: LocalVersion) -> None: ...


Prepare = Callable[[], Awaitable[None]]
Held = dict[str, tuple[int, VersionRef | None]]


def _same(a: VersionRef | None, b: VersionRef | LocalVersion) -> bool:
    return a is not None and a.version == b.version and a.digest == b.digest


def _combine(outcomes: Iterable[Outcome]) -> Outcome:
    outcomes = list(outcomes)
    retries = [o for o in outcomes if isinstance(o, Retry)]
    if retries:
        return Retry(reason="; ".join(r.reason for r in retries if r.reason))
    failed = [o for o in outcomes if isinstance(o, Failed)]
    if failed:
        return Failed("; ".join(f.reason for f in failed))
    return Done()


class Reconciler:
    """Closes the gap between the desired state and this host, one key at a time."""

    def __init__(self, *, base_model: str, registry: DesiredReader | None,
                 routes: RouteTable, swapper: AliasApplier, cache: CacheControl,
                 queue: WorkQueue[str], metrics: AgentMetrics, max_attempts: int,
                 pins: Iterable[str] = (), prewarm: Iterable[str] = (),
                 local: LocalSource | None = None,
                 on_change: Callable[[], None] | None = None, agent_id: str = "",
                 max_loaded: int | None = None) -> None:
        """``registry`` None: only the watched folder (``local``) is desired.
        ``max_loaded`` (the cache's capacity) bounds what placement pins."""
        self.base_model = base_model
        self._registry = registry
        self._routes = routes  # read only: the swapper writes it
        self._swapper = swapper
        self._cache = cache
        self._queue = queue
        self._metrics = metrics
        self._pins = list(pins)
        self._prewarm = list(prewarm)
        self._local = local
        self._on_change = on_change or (lambda: None)
        self._failures = Failures(max_attempts=max_attempts, metrics=metrics,
                                  on_change=self._on_change)
        self.mirror = DesiredMirror()
        self.route_sync = RouteSync(swapper)
        self._generation: dict[str, int] = {}
        self._pending: dict[tuple[str, str], int | None] = {}
        self.last_snapshot: DesiredState | None = None
        configured = {p.partition("@")[0] for p in self._pins}
        # One slot stays free for on-demand loads (see control/placement.py).
        slots = None if max_loaded is None else max(0, max_loaded - 1 - len(configured))
        self.placement = Placement(agent_id, cache, configured=configured, slots=slots,
                                   requeue=queue.add, metrics=metrics,
                                   on_change=self._on_change)

    # --- intake and views -------------------------------------------------------------

    def notify(self, key: str) -> None:
        """Re-read ``key`` from its source: queue it, and never answer it from the mirror."""
        self._touch(key)
        self.mirror.drop(key)
        self._queue.add(key)

    def on_event(self, event: Event) -> None:
        """An event from the stream: act on what it carries when it can be trusted."""
        if isinstance(event, FleetChanged):
            if event.base_model == self.base_model:
                self._fleet_changed(event)
            return
        if isinstance(event, RouteChanged):
            # Every tenant's rule change, of any base model: each one moves the
            # tenant's revision, and a revision skipped here would read as a gap.
            if self.route_sync.on_event(event):
                self.notify(ROUTES)
            else:
                self._on_change()
            return
        key = key_for(event, self.base_model)
        if key is None or key == CREDENTIALS:  # the credentials refresher's, not ours
            return
        self._touch(key)
        if isinstance(event, AdapterUpdated):
            # One line per alias move, like the swap's: where a move's time goes starts
            # here (bench/agent_publish_to_served.py reads it).
            log.info("event: %s@%s -> %s (revision %d)", event.adapter, event.alias,
                     event.version, event.revision)
        if self.mirror.apply(event):
            self._queue.add(key)

    def _fleet_changed(self, event: FleetChanged) -> None:
        # Every placed adapter re-checks its owners from the mirror: no registry read,
        # and only those whose owners changed are pinned or unpinned. An event older
        # than the fleet held changes nothing.
        if not self.placement.set_fleet(event.agents, event.seq):
            return
        for name in sorted(self.mirror.placed() | self.placement.owned()):
            if not self._is_local(name):
                self._queue.add(name)

    def failures(self) -> list[VersionFailure]:
        return self._failures.list()

    def pending(self) -> dict[tuple[str, str], int | None]:
        """(adapter, alias) -> the version being swapped in right now (None: removal)."""
        return dict(self._pending)

    def pin_configured(self) -> None:
        """Pin every ``--pin`` adapter in the cache (before anything is loaded)."""
        for spec in self._pins:
            self._cache.pin(spec.partition("@")[0])

    def _is_local(self, adapter: str) -> bool:
        return self._local is not None and self._local.owns(adapter)

    # --- the handler ------------------------------------------------------------------

    async def reconcile(self, key: str) -> Outcome:
        """The work-queue handler."""
        try:
            if key == ALL:
                await self.resync_all()
                return Done()
            if key == ROUTES:
                await self.refresh_routes()
                return Done()
            if key == VLLM:
                await self.repair_vllm()
                return Done()
        except AgentError as exc:
            log.warning("%s: %s (%s); will retry", key, exc.message, exc.code)
            return Retry(reason=exc.message)
        adapter = local_adapter(key)
        if adapter is not None:
            return await self._reconcile_local(adapter)
        return await self._reconcile_adapter(key)

    async def resync_all(self) -> DesiredState:
        """Read the whole snapshot, apply its routes, queue every adapter, repair vLLM
        and count the disk cache again."""
        registry = self._require_registry()
        started, rules_since = dict(self._generation), self.route_sync.mark()
        snapshot = await registry.desired(self.base_model)
        self.last_snapshot = snapshot
        # Every adapter is queued below: each re-checks its owners against this fleet.
        self.placement.set_fleet(snapshot.agents, snapshot.event_seq, reset=True)
        self.route_sync.take(snapshot, rules_since)
        desired = {a.name: a for a in snapshot.adapters if a.base_model == self.base_model}
        known = self._routes.adapters() | self._failures.adapters()
        for name in sorted(set(desired) | known):
            if self._is_local(name):
                continue
            if self._generation.get(name, 0) == started.get(name, 0):
                self.mirror.replace(name, desired.get(name))
            self._queue.add(name)
        await self.repair_vllm()
        await self._swapper.recount_disk()
        return snapshot

    async def repair_vllm(self) -> None:
        """Match the cache to what vLLM has (a vLLM restart, an unload by hand)."""
        lost = await self._cache.resync()
        if lost:
            log.warning("vLLM no longer had %s; they load again when needed",
                        ", ".join(sorted(lost)))
        # Pinned versions vLLM lost load again now, not at their next request. Adapters
        # not routed yet (start-up) are loaded by their own reconcile, being pinned.
        await self.warm(self._pins, only_routed=True)

    async def refresh_routes(self) -> None:
        since = self.route_sync.mark()
        snapshot = await self._require_registry().desired(self.base_model)
        self.route_sync.take(snapshot, since)
        self._on_change()

    def _require_registry(self) -> DesiredReader:
        if self._registry is None:
            raise TerminalError("this agent has no registry to read", code="no_source")
        return self._registry

    async def warm(self, specs: Iterable[str] | None = None, *,
                   only_routed: bool = False) -> list[AgentError]:
        """Load what ``specs`` (``name``, ``name@alias``, ``name@7``) route to now.

        With no argument: the pinned and pre-warmed adapters, as at start-up. A failure
        is logged, counted and returned; the adapter then loads at its first request.
        """
        errors: list[AgentError] = []
        for spec in (self._pins + self._prewarm) if specs is None else specs:
            ref = self._resolve_spec(spec)
            if ref is None:
                if not only_routed:
                    log.warning("cannot warm %s: nothing routes there", spec)
                continue
            try:
                await self._cache.ensure_active(ref)
            except AgentError as exc:
                self._metrics.count_failure(ref.adapter, exc)
                log.warning("warming %s@%d failed: %s", ref.adapter, ref.version, exc.message)
                errors.append(exc)
        return errors

    def _resolve_spec(self, spec: str) -> VersionRef | None:
        parsed = parse_model_ref(spec)
        if parsed is None:
            return None
        aliases = self._routes.aliases(parsed.adapter)
        if parsed.version is not None:
            return next((ref for _rev, ref in aliases.values()
                         if ref.version == parsed.version), None)
        found = aliases.get(parsed.selector)
        return found[1] if found is not None else None

    # --- one adapter from the registry ------------------------------------------------

    async def _reconcile_adapter(self, adapter: str) -> Outcome:
        if self._is_local(adapter):
            return Done()
        try:
            desired = await self._desired_adapter(adapter)
        except AgentError as exc:
            log.warning("%s: reading desired state failed: %s", adapter, exc.message)
            return Retry(reason=exc.message)
        want = {a.alias: a for a in desired.aliases} if desired is not None else {}
        held = self._routes.held(adapter)  # read once: this key's worker is its only mover
        if self._needs_reset(held, want):
            outcome = await self._reset(adapter, held)
            if not isinstance(outcome, Done):
                return outcome
            held = {}
        if desired is not None:
            # After a reset (which forgets it), before any move: a version is never
            # routed without its tenant known.
            self._swapper.set_owner(adapter, desired.tenant)
        # Before any move: an owner's new version loads before the alias flips to it.
        kept = self.placement.place(adapter, desired.replicas if desired else None)
        placed = desired is not None and desired.replicas is not None
        outcomes = [await self._move(adapter, alias, revision + 1, None)
                    for alias, (revision, ref) in sorted(held.items())
                    if ref is not None and alias not in want]
        outcomes += [await self._sync_alias(adapter, want[alias], held.get(alias, (0, None)),
                                            placed=placed)
                     for alias in sorted(want)]
        outcome = _combine(outcomes)
        if desired is None and not isinstance(outcome, Retry):
            self._swapper.drop_adapter(adapter)
        self._failures.keep_only(adapter, [(a.target.version, a.target.digest)
                                           for a in want.values()])
        if kept:
            errors = await self.warm([f"{adapter}@{alias}" for alias in sorted(want)],
                                     only_routed=True)
            # vLLM down, or every slot busy with requests in flight: kept hot means the
            # load is retried with this key's backoff, not left to the first request.
            outcome = _combine([outcome, *(Retry(reason=e.message) for e in errors
                                           if e.retryable)])
        return outcome

    async def _desired_adapter(self, adapter: str) -> DesiredAdapter | None:
        known = self.mirror.get(adapter)
        if known is not MISSING:
            return known if isinstance(known, DesiredAdapter) else None
        registry = self._require_registry()
        with self._metrics.stage("desired"):
            snapshot = await registry.desired(self.base_model, adapter=adapter)
        if snapshot.agents:  # an older registry lists none: keep the last fleet
            self.placement.set_fleet(snapshot.agents, snapshot.event_seq)
        # Any snapshot read before this one is now older than what we act on.
        self._touch(adapter)
        found = next((a for a in snapshot.adapters
                      if a.name == adapter and a.base_model == self.base_model), None)
        self.mirror.replace(adapter, found)
        return found

    def _touch(self, adapter: str) -> None:
        self._generation[adapter] = self._generation.get(adapter, 0) + 1

    @staticmethod
    def _needs_reset(held: Held, want: dict[str, DesiredAlias]) -> bool:
        # A desired move no newer than what we hold, yet different: the registry's
        # history restarted (adapter re-created, database restored). Its word wins.
        for alias, desired in want.items():
            revision, ref = held.get(alias, (0, None))
            if revision >= desired.revision and not _same(ref, desired.target):
                return True
        return False

    async def _reset(self, adapter: str, held: Held) -> Outcome:
        log.warning("%s: the registry's alias history restarted; re-applying it", adapter)
        outcome = _combine([await self._move(adapter, alias, revision + 1, None)
                            for alias, (revision, ref) in sorted(held.items())
                            if ref is not None])
        if isinstance(outcome, Done):
            self._swapper.drop_adapter(adapter)
        return outcome

    async def _sync_alias(self, adapter: str, desired: DesiredAlias,
                          held: tuple[int, VersionRef | None], *, placed: bool) -> Outcome:
        revision, ref = held
        target = desired.target
        same_canary = self._routes.canary(adapter, desired.alias) == desired.canary
        if _same(ref, target) and same_canary:
            if desired.revision > revision:
                # Moved away and back: same weights, only the revision to record.
                self._swapper.record(adapter, desired.alias, desired.revision, target)
            return Done()
        if not _same(ref, target) and self._failures.is_bad(adapter, target.version,
                                                            target.digest):
            return Done()
        return await self._move(adapter, desired.alias, desired.revision, target,
                                placed=placed, canary=desired.canary)

    # --- one folder of the watch dir ----------------------------------------------------

    async def _reconcile_local(self, adapter: str) -> Outcome:
        """Make what ``adapter`` serves match its folder in the watch dir."""
        if self._local is None:
            return Failed(f"{adapter}: this agent watches no folder")
        local = self._local
        revision, current = self._routes.alias(adapter, LOCAL_ALIAS)
        found = await local.read(adapter, current)
        if found is None:
            return await self._remove_local(adapter, revision, current)
        self._failures.keep_only(adapter, [(found.version, found.digest)])
        self._swapper.set_owner(adapter, local.tenant)
        if _same(current, found):
            return Done()
        if self._failures.is_bad(adapter, found.version, found.digest):
            return Done()  # the same broken files again: wait for the next change
        try:
            ref = found.ref(self.base_model)
        except AgentError as exc:
            # Files being written show up as a broken folder first; the write's own
            # change event queues the folder again, so a terminal refusal waits for it.
            return self._failures.record(adapter, LOCAL_ALIAS, (found.version, found.digest),
                                         exc)
        return await self._move(adapter, LOCAL_ALIAS, revision + 1, ref,
                                prepare=lambda: local.copy_in(ref, found))

    async def _remove_local(self, adapter: str, revision: int,
                            current: VersionRef | None) -> Outcome:
        if current is not None:
            outcome = await self._move(adapter, LOCAL_ALIAS, revision + 1, None)
            if not isinstance(outcome, Done):
                return outcome
            self._swapper.drop_adapter(adapter)
            log.info("watch dir: %s removed", adapter)
        if self._local is not None:
            self._local.release(adapter)
        self._failures.keep_only(adapter, [])
        return Done()

    # --- moves ---------------------------------------------------------------------------

    def _readiness(self, adapter: str, alias: str, *, placed: bool) -> Readiness:
        """How far a new version of ``adapter@alias`` goes before the flip: loaded if
        the alias's current version is loaded or the adapter pinned (``--pin``, kept hot
        by placement); left cold if it is placed and not ours, so an agent that neither
        owns nor serves it downloads nothing until its first request; else fetched
        (no placement setting, or owned but over capacity: see placement.py)."""
        _revision, current = self._routes.alias(adapter, alias)
        if current is not None and self._cache.is_active(
                versioned_name(adapter, current.version)):
            return "hot"
        if self._cache.is_pinned(adapter):
            return "hot"
        return "cold" if placed and adapter not in self.placement.owned() else "warm"

    async def _move(self, adapter: str, alias: str, revision: int, ref: VersionRef | None,
                    prepare: Prepare | None = None, *, placed: bool = False,
                    canary: CanaryRoute | None = None) -> Outcome:
        self._pending[(adapter, alias)] = ref.version if ref is not None else None
        self._on_change()
        mark = (ref.version, ref.digest) if ref is not None else None
        try:
            if prepare is not None:
                await prepare()
            ready = self._readiness(adapter, alias, placed=placed)
            result = await self._swapper.apply(adapter, alias, revision, ref, ready, canary)
        except AgentError as exc:
            return self._failures.record(adapter, alias, mark, exc)
        except Exception as exc:
            # A bug must not take the version for a bad one: retried, never marked.
            log.exception("%s@%s: swap raised", adapter, alias)
            error = RetryableError(f"{type(exc).__name__}: {exc}", code="internal_error")
            return self._failures.record(adapter, alias, mark, error)
        finally:
            self._pending.pop((adapter, alias), None)
            self._on_change()
        if ref is not None:
            self._failures.succeeded(adapter, ref.version, ref.digest)
        if not result.flipped:
            log.info("%s@%s: revision %d not newer here; left as is", adapter, alias, revision)
        return Done()
