"""Versions that failed on this host: attempts counted, and when one is marked bad.

A failure is kept per (adapter, version, digest) while that version stays desired. Which
failures mark a version bad: terminal ones at once, retryable ones after
``max_attempts``. A dependency being down (vLLM, the registry, a full cache) says
nothing about the version: retried forever and never counted, or a restarting vLLM
would mark every version bad. A bad version is not tried again until the desired
version changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from inference_agent.control.workqueue import Failed, Outcome, Retry
from inference_agent.errors import (
    AgentError,
    CapacityExhausted,
    RegistryUnavailable,
    VllmUnavailable,
)
from inference_agent.metrics import AgentMetrics

log = logging.getLogger(__name__)

_OUTAGES = (VllmUnavailable, RegistryUnavailable, CapacityExhausted)


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


class Failures:
    """The failed versions of this host, for the reconciler and the status report."""

    def __init__(self, *, max_attempts: int, metrics: AgentMetrics,
                 on_change: Callable[[], None]) -> None:
        self.max_attempts = max_attempts
        self._metrics = metrics
        self._on_change = on_change
        self._marks: dict[tuple[str, int, str], VersionFailure] = {}

    def list(self) -> list[VersionFailure]:
        return sorted(self._marks.values(), key=lambda f: (f.adapter, f.alias, f.version))

    def adapters(self) -> set[str]:
        return {adapter for adapter, _version, _digest in self._marks}

    def is_bad(self, adapter: str, version: int, digest: str) -> bool:
        failure = self._marks.get((adapter, version, digest))
        return failure is not None and failure.bad

    def succeeded(self, adapter: str, version: int, digest: str) -> None:
        self._marks.pop((adapter, version, digest), None)

    def record(self, adapter: str, alias: str, mark: tuple[int, str] | None,
               exc: AgentError) -> Outcome:
        """A move of ``alias`` to ``mark`` (version, digest; None: a removal) failed:
        count it, and say whether to retry it or give it up."""
        # Counted here unless the materializer or the cache counted it where it happened.
        self._metrics.count_failure(adapter, exc)
        if mark is None:
            log.warning("%s@%s: removal failed: %s", adapter, alias, exc.message)
            return Retry(reason=exc.message)
        version, digest = mark
        previous = self._marks.get((adapter, version, digest))
        attempts = previous.attempts if previous is not None else 0
        if not isinstance(exc, _OUTAGES):
            attempts += 1
        bad = not exc.retryable or attempts >= self.max_attempts
        self._marks[(adapter, version, digest)] = VersionFailure(
            adapter=adapter, alias=alias, version=version, digest=digest,
            code=exc.code, reason=exc.message, attempts=attempts, bad=bad)
        self._on_change()
        where = f"{adapter}@{version} ({alias})"
        if bad:
            log.error("%s marked bad on this host after %d attempt(s): %s: %s",
                      where, attempts, exc.code, exc.message)
            return Failed(f"{where}: {exc.message}")
        log.warning("%s failed (%d of %d attempts counted): %s: %s", where, attempts,
                    self.max_attempts, exc.code, exc.message)
        return Retry(reason=f"{where}: {exc.message}")

    def keep_only(self, adapter: str, wanted: Iterable[tuple[int, str]]) -> None:
        """Drop ``adapter``'s marks for versions no longer desired: a mark lasts while
        its version is desired, and a new move starts from scratch."""
        keep = set(wanted)
        stale = [mark for mark in self._marks
                 if mark[0] == adapter and (mark[1], mark[2]) not in keep]
        for mark in stale:
            del self._marks[mark]
        if stale:
            self._on_change()
