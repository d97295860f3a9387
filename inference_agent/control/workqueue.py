"""A de-duplicating work queue, after controller-runtime's.

A key is queued at most once however often it is added. A key being processed is never
handed to a second worker: adding it meanwhile marks it dirty, and it is queued again
once, when its worker finishes. Different keys run in parallel on N workers.

Each key has its own exponential backoff with jitter, reset when the key is done.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Done:
    """The key reached its desired state."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Try the key again later: after ``after`` seconds, or the key's backoff if None."""

    after: float | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Failed:
    """Give up on the key until something adds it again."""

    reason: str


Outcome: TypeAlias = Done | Retry | Failed


class Backoff(Generic[K]):
    """Per-key exponential backoff: ``base * 2**failures`` capped at ``cap``, with jitter.

    The jitter draws from the upper half of the interval, so keys that failed together
    spread out without any of them retrying much sooner than its backoff says.
    """

    def __init__(self, base_s: float = 0.5, cap_s: float = 30.0,
                 rng: random.Random | None = None) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise ValueError("backoff needs 0 < base_s <= cap_s")
        self.base_s = base_s
        self.cap_s = cap_s
        self._failures: dict[K, int] = {}
        self._rng = rng or random.Random()

    def next_delay(self, key: K) -> float:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        # The exponent is bounded so a key failing for weeks cannot overflow a float.
        ceiling = min(self.cap_s, self.base_s * 2 ** min(failures, 62))
        return float(ceiling * self._rng.uniform(0.5, 1.0))

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)


Handler: TypeAlias = Callable[[K], Awaitable[Outcome]]


class WorkQueue(Generic[K]):
    """Keys waiting for a worker; see the module docstring for the guarantees."""

    def __init__(self, *, backoff: Backoff[K] | None = None, name: str = "work") -> None:
        self.name = name
        self.backoff: Backoff[K] = backoff or Backoff()
        self._queue: deque[K] = deque()
        # Keys that must be (re)processed: queued, or added again while processing.
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        # Workers sleep on _wake; add/done/shutdown set it and every sleeper re-checks.
        # There is no await between a check and its action, so no lock is needed.
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        # Nothing queued and nothing processing (pending retry timers do not count).
        self._settled = asyncio.Event()
        self._settled.set()
        self._shutting_down = False

    # --- intake -----------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Queue ``key`` unless it is already waiting; ignored after shutdown."""
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        self._settled.clear()
        if key not in self._processing:
            self._queue.append(key)
            self._notify()

    def add_after(self, key: K, delay_s: float) -> None:
        """Queue ``key`` in ``delay_s`` seconds; an earlier pending timer for it wins."""
        if self._shutting_down:
            return
        if delay_s <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay_s
        pending = self._timers.get(key)
        if pending is not None:
            if pending[0] <= due:
                return
            pending[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def add_rate_limited(self, key: K) -> float:
        """Queue ``key`` after its next backoff delay; returns that delay."""
        delay = self.backoff.next_delay(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Reset ``key``'s backoff and drop its pending retry timer."""
        self.backoff.forget(key)
        pending = self._timers.pop(key, None)
        if pending is not None:
            pending[1].cancel()

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _notify(self) -> None:
        self._wake.set()

    # --- workers ----------------------------------------------------------------------

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def __len__(self) -> int:
        return len(self._queue)

    def is_processing(self, key: K) -> bool:
        return key in self._processing

    def pending_retries(self) -> set[K]:
        return set(self._timers)

    async def get(self) -> K | None:
        """The next key, marked as processing; None once the queue shuts down."""
        while not self._shutting_down:
            if self._queue:
                key = self._queue.popleft()
                self._processing.add(key)
                self._dirty.discard(key)
                self._idle.clear()
                return key
            self._wake.clear()
            await self._wake.wait()
        return None

    def done(self, key: K) -> None:
        """``key``'s worker finished: queue it again if it was added meanwhile."""
        self._processing.discard(key)
        if key in self._dirty and not self._shutting_down:
            self._queue.append(key)
            self._wake.set()
        if not self._processing:
            self._idle.set()
            if not self._queue:
                self._settled.set()

    async def run(self, handler: Handler[K], workers: int = 4) -> None:
        """Process keys on ``workers`` tasks until ``shutdown()``."""
        if workers < 1:
            raise ValueError("workers must be at least 1")
        async with asyncio.TaskGroup() as group:
            for index in range(workers):
                group.create_task(self._worker(handler), name=f"{self.name}-worker-{index}")

    async def _worker(self, handler: Handler[K]) -> None:
        while (key := await self.get()) is not None:
            try:
                outcome = await self._handle(handler, key)
                self._settle(key, outcome)
            finally:
                self.done(key)
            # A key with nothing to change never waits, so without this turn a resync
            # of hundreds of unchanged adapters ran as one step, holding the loop.
            await asyncio.sleep(0)

    async def _handle(self, handler: Handler[K], key: K) -> Outcome:
        try:
            return await handler(key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A bug in one key's handling must not stop the other keys' workers.
            log.exception("%s: handling %r raised", self.name, key)
            return Retry(reason=f"{type(exc).__name__}: {exc}")

    def _settle(self, key: K, outcome: Outcome) -> None:
        if isinstance(outcome, Retry):
            if outcome.after is None:
                self.add_rate_limited(key)
            else:
                self.add_after(key, outcome.after)
        else:
            # Done and Failed both reset the backoff: the next attempt at a Failed key
            # comes from a new add (a new desired version), which starts from scratch.
            self.forget(key)

    async def join(self, timeout_s: float | None = None) -> bool:
        """Wait until nothing is queued or processing; False on timeout.

        Keys waiting on a retry timer do not count: start-up waits for a first pass over
        every key, not for a version that keeps failing.
        """
        try:
            async with asyncio.timeout(timeout_s):
                await self._settled.wait()
        except TimeoutError:
            return False
        return True

    async def shutdown(self, timeout_s: float | None = None) -> bool:
        """Stop intake and workers; wait for in-flight handlers. False on timeout."""
        self._shutting_down = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._queue.clear()
        self._dirty.clear()
        self._wake.set()
        self._settled.set()
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True
