"""The reconcile loop: desired state (registry) against actual state (route table, vLLM).

Keys on the work queue are adapter names, plus two special keys: ``*routes*`` (routing
rules changed) and ``*all*`` (full resync: re-read everything, re-check every adapter,
repair drift in vLLM). Events only add keys; what to do is always decided from a fresh
read of the registry, so a late, duplicated or lost event changes nothing wrong.

A full resync reads one snapshot for every adapter. To spare one request per adapter,
the snapshot's entry for an adapter is handed to that adapter's next reconcile, unless
anything about that adapter happened since the snapshot read started (an event, or a
fresh read): then the reconcile reads the registry itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from inference_agent.errors import (
    AgentError,
    CapacityExhausted,
    RegistryUnavailable,
    RetryableError,
    VllmUnavailable,
)
from inference_agent.metrics import AgentMetrics
from inference_agent.routing import RouteTable
from inference_agent.swap import SwapResult
from inference_agent.workqueue import Done, Failed, Outcome, Retry, WorkQueue
from loraplane.events import DesiredAdapter, DesiredAlias, DesiredState, VersionRef
from loraplane.naming import parse_model_ref

log = logging.getLogger(__name__)

ALL = "*all*"
ROUTES = "*routes*"
_NO_HINT = object()
# A dependency being down says nothing about the version: retried forever, never counted
# towards marking the version bad (a vLLM restart must not condemn every version).
_OUTAGES = (VllmUnavailable, RegistryUnavailable, CapacityExhausted)


class DesiredReader(Protocol):
    async def desired(self, base_model: str, adapter: str | None = None) -> DesiredState: ...


class AliasApplier(Protocol):
    async def apply(self, adapter: str, alias: str, revision: int,
                    ref: VersionRef | None) -> SwapResult: ...


class CacheControl(Protocol):
    def pin(self, adapter: str) -> None: ...

    async def ensure_active(self, ref: VersionRef) -> str: ...

    async def resync(self) -> set[str]: ...


@dataclass(frozen=True)
class VersionFailure:
    """A version that failed here; ``bad`` once it is not retried any more."""

    adapter: str
    alias: str
    version: int
    digest: str
    code: str
    reason: str
    attempts: int
    bad: bool


def _same(a: VersionRef | None, b: VersionRef) -> bool:
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
    """Closes the gap between the registry and this host, one key at a time."""

    def __init__(self, *, base_model: str, registry: DesiredReader, routes: RouteTable,
                 swapper: AliasApplier, cache: CacheControl, queue: WorkQueue[str],
                 metrics: AgentMetrics, max_attempts: int, pins: Iterable[str] = (),
                 prewarm: Iterable[str] = (), is_local: Callable[[str], bool] | None = None,
                 on_change: Callable[[], None] | None = None) -> None:
        self.base_model = base_model
        self._registry = registry
        self._routes = routes
        self._swapper = swapper
        self._cache = cache
        self._queue = queue
        self._metrics = metrics
        self._max_attempts = max_attempts
        self._pins = list(pins)
        self._prewarm = list(prewarm)
        self._is_local = is_local or (lambda _adapter: False)
        self._on_change = on_change or (lambda: None)
        self._hints: dict[str, DesiredAdapter | None] = {}
        self._generation: dict[str, int] = {}
        self._failures: dict[tuple[str, int, str], VersionFailure] = {}
        self._pending: dict[tuple[str, str], int | None] = {}
        self.last_snapshot: DesiredState | None = None

    # --- intake and views -------------------------------------------------------------

    def notify(self, key: str) -> None:
        """An event named ``key``: queue it, and never answer it from an older snapshot."""
        self._touch(key)
        self._queue.add(key)

    def failures(self) -> list[VersionFailure]:
        return sorted(self._failures.values(), key=lambda f: (f.adapter, f.alias, f.version))

    def pending(self) -> dict[tuple[str, str], int | None]:
        """(adapter, alias) -> the version being swapped in right now (None: removal)."""
        return dict(self._pending)

    def pin_configured(self) -> None:
        """Pin every ``--pin`` adapter in the cache (before anything is loaded)."""
        for spec in self._pins:
            self._cache.pin(spec.partition("@")[0])

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
        except AgentError as exc:
            log.warning("%s: %s (%s); will retry", key, exc.message, exc.code)
            return Retry(reason=exc.message)
        return await self._reconcile_adapter(key)

    async def resync_all(self) -> DesiredState:
        """Read the whole snapshot, apply its routes, queue every adapter, repair vLLM."""
        started = dict(self._generation)
        snapshot = await self._registry.desired(self.base_model)
        self.last_snapshot = snapshot
        self._routes.set_rules(list(snapshot.routes))
        desired = {a.name: a for a in snapshot.adapters if a.base_model == self.base_model}
        known = self._routes.adapters() | {f.adapter for f in self._failures.values()}
        for name in sorted(set(desired) | known):
            if self._is_local(name):
                continue
            if self._generation.get(name, 0) == started.get(name, 0):
                self._hints[name] = desired.get(name)
            self._queue.add(name)
        lost = await self._cache.resync()
        if lost:
            log.warning("vLLM no longer had %s; they load again when needed",
                        ", ".join(sorted(lost)))
        # Pinned versions vLLM lost load again now, not at their next request. Adapters
        # not routed yet (start-up) are loaded by their own reconcile, being pinned.
        await self.warm(self._pins, only_routed=True)
        return snapshot

    async def refresh_routes(self) -> None:
        snapshot = await self._registry.desired(self.base_model)
        self._routes.set_rules(list(snapshot.routes))
        self._on_change()

    async def warm(self, specs: Iterable[str] | None = None, *,
                   only_routed: bool = False) -> None:
        """Load what ``specs`` (``name``, ``name@alias``, ``name@7``) route to now.

        With no argument: the pinned and pre-warmed adapters, as at start-up. A failure
        is logged and counted; the adapter then loads at its first request.
        """
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

    # --- one adapter ------------------------------------------------------------------

    async def _reconcile_adapter(self, adapter: str) -> Outcome:
        if self._is_local(adapter):
            return Done()
        try:
            desired = await self._desired_adapter(adapter)
        except AgentError as exc:
            log.warning("%s: reading desired state failed: %s", adapter, exc.message)
            return Retry(reason=exc.message)
        want = {a.alias: a for a in desired.aliases} if desired is not None else {}
        if self._needs_reset(adapter, want):
            outcome = await self._reset(adapter)
            if not isinstance(outcome, Done):
                return outcome
        have = self._routes.aliases(adapter)
        outcomes = [await self._move(adapter, alias, have[alias][0] + 1, None)
                    for alias in sorted(set(have) - set(want))]
        outcomes += [await self._sync_alias(adapter, want[alias]) for alias in sorted(want)]
        outcome = _combine(outcomes)
        if desired is None and not isinstance(outcome, Retry):
            self._routes.drop_adapter(adapter)
        self._forget_failures(adapter, {(a.target.version, a.target.digest)
                                        for a in want.values()})
        return outcome

    async def _desired_adapter(self, adapter: str) -> DesiredAdapter | None:
        hint = self._hints.pop(adapter, _NO_HINT)
        if hint is not _NO_HINT:
            return hint if isinstance(hint, DesiredAdapter) else None
        with self._metrics.stage("desired"):
            snapshot = await self._registry.desired(self.base_model, adapter=adapter)
        # Any snapshot read before this one is now older than what we act on.
        self._touch(adapter)
        return next((a for a in snapshot.adapters
                     if a.name == adapter and a.base_model == self.base_model), None)

    def _touch(self, adapter: str) -> None:
        self._generation[adapter] = self._generation.get(adapter, 0) + 1
        self._hints.pop(adapter, None)

    def _needs_reset(self, adapter: str, want: dict[str, DesiredAlias]) -> bool:
        # A desired move no newer than what we hold, yet different: the registry's
        # history restarted (adapter re-created, database restored). Its word wins.
        for alias, desired in want.items():
            revision, ref = self._routes.alias(adapter, alias)
            if revision >= desired.revision and not _same(ref, desired.target):
                return True
        return False

    async def _reset(self, adapter: str) -> Outcome:
        log.warning("%s: the registry's alias history restarted; re-applying it", adapter)
        have = self._routes.aliases(adapter)
        outcome = _combine([await self._move(adapter, alias, revision + 1, None)
                            for alias, (revision, _ref) in sorted(have.items())])
        if isinstance(outcome, Done):
            self._routes.drop_adapter(adapter)
        return outcome

    async def _sync_alias(self, adapter: str, desired: DesiredAlias) -> Outcome:
        revision, ref = self._routes.alias(adapter, desired.alias)
        target = desired.target
        if _same(ref, target):
            if desired.revision > revision:
                # Moved away and back: same weights, only the revision to record.
                self._routes.set_alias(adapter, desired.alias, desired.revision, target)
            return Done()
        failure = self._failures.get((adapter, target.version, target.digest))
        if failure is not None and failure.bad:
            return Done()
        return await self._move(adapter, desired.alias, desired.revision, target)

    async def _move(self, adapter: str, alias: str, revision: int,
                    ref: VersionRef | None) -> Outcome:
        self._pending[(adapter, alias)] = ref.version if ref is not None else None
        self._on_change()
        try:
            result = await self._swapper.apply(adapter, alias, revision, ref)
        except AgentError as exc:
            return self._failed(adapter, alias, ref, exc)
        except Exception as exc:
            # A bug must not take the version for a bad one: retried, never marked.
            log.exception("%s@%s: swap raised", adapter, alias)
            error = RetryableError(f"{type(exc).__name__}: {exc}", code="internal_error")
            return self._failed(adapter, alias, ref, error)
        finally:
            self._pending.pop((adapter, alias), None)
            self._on_change()
        if ref is not None:
            self._failures.pop((adapter, ref.version, ref.digest), None)
        if not result.flipped:
            log.info("%s@%s: revision %d not newer here; left as is", adapter, alias, revision)
        return Done()

    def _failed(self, adapter: str, alias: str, ref: VersionRef | None,
                exc: AgentError) -> Outcome:
        # Counted here unless the materializer or the cache counted it where it happened.
        self._metrics.count_failure(adapter, exc)
        if ref is None:
            log.warning("%s@%s: removal failed: %s", adapter, alias, exc.message)
            return Retry(reason=exc.message)
        mark = (adapter, ref.version, ref.digest)
        previous = self._failures.get(mark)
        attempts = previous.attempts if previous is not None else 0
        if not isinstance(exc, _OUTAGES):
            attempts += 1
        bad = not exc.retryable or attempts >= self._max_attempts
        self._failures[mark] = VersionFailure(
            adapter=adapter, alias=alias, version=ref.version, digest=ref.digest,
            code=exc.code, reason=exc.message, attempts=attempts, bad=bad)
        where = f"{adapter}@{ref.version} ({alias})"
        if bad:
            log.error("%s marked bad on this host after %d attempt(s): %s: %s",
                      where, attempts, exc.code, exc.message)
            return Failed(f"{where}: {exc.message}")
        log.warning("%s failed (%d of %d attempts counted): %s: %s", where, attempts,
                    self._max_attempts, exc.code, exc.message)
        return Retry(reason=f"{where}: {exc.message}")

    def _forget_failures(self, adapter: str, wanted: set[tuple[int, str]]) -> None:
        # A mark lasts while its version is desired; a new move starts from scratch.
        stale = [mark for mark in self._failures
                 if mark[0] == adapter and (mark[1], mark[2]) not in wanted]
        for mark in stale:
            del self._failures[mark]
        if stale:
            self._on_change()
