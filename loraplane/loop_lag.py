"""Event-loop lag: how late a periodic tick runs, and who held the loop when it runs late.

A tick task sleeps ``interval_s`` at a time and observes how much later than due it
woke into a histogram: anything that holds the loop (CPU work, a blocking call) delays
it. A watchdog thread, which the loop cannot hold, watches the tick's due time. When the
tick is more than ``warn_after_s`` overdue it logs one warning naming the task running on
the loop and the innermost project frame of the loop thread's stack; when the tick runs
again, one more line gives the stall's whole length. Both services run one
(docs/operations.md, "The event loop is held").
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry, Histogram

log = logging.getLogger(__name__)

# 5 ms is the goal for a service's p99 lag (issue 41): it stays a bucket edge.
LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
               5.0, 10.0)
DEFAULT_INTERVAL_S = 0.1
DEFAULT_WARN_AFTER_S = 0.1
# How long a thread may hold the GIL while another waits for it (Python's default is
# 5 ms). A loop waking for a request waits that long for a busy thread (the collector's
# listing, a report's parse) at every wake, several times a request.
# Why: docs/decisions.md#the-gil-switch-interval-is-1-ms
DEFAULT_SWITCH_INTERVAL_S = 0.001
# Frames of these top-level packages (beside this one) name a holder; the innermost
# frame of any file names it when none of theirs is on the stack.
PROJECT_PACKAGES = ("loraplane", "loraplane_cli", "registry_service", "inference_agent")
PROJECT_ROOT = Path(__file__).resolve().parent.parent
UNKNOWN = "unknown"
# The watchdog looks this long after the threshold is crossed, never sooner.
_MIN_LOOK_S = 0.001


def check_loop_lag(interval_s: float, warn_after_s: float) -> None:
    """Refuse a service's ``loop_lag_interval_s`` / ``loop_lag_warn_s`` pair.

    A stall shows from the tick's due time on, which comes up to one interval after the
    stall began: a threshold below the interval would claim a precision the tick lacks."""
    if interval_s <= 0 or warn_after_s <= 0:
        raise ValueError("loop_lag_interval_s and loop_lag_warn_s must be positive")
    if warn_after_s < interval_s:
        raise ValueError("loop_lag_warn_s must be at least loop_lag_interval_s")


def lag_histogram(registry: CollectorRegistry, name: str) -> Histogram:
    """The lag histogram ``name`` in ``registry``, with the buckets every service shares."""
    return Histogram(name, "How late the event loop ran a periodic tick: the time "
                     "anything held the loop past the tick's due time",
                     buckets=LAG_BUCKETS, registry=registry)


def running_task_name(loop: asyncio.AbstractEventLoop) -> str:
    """The name of the task ``loop`` runs now, read from any thread.

    asyncio keeps it in a private dict; a Python without it answers "unknown"."""
    try:
        current = getattr(asyncio.tasks, "_current_tasks", None)
        task = current.get(loop) if isinstance(current, dict) else UNKNOWN
    except Exception:  # a private structure, read from another thread
        return UNKNOWN
    if task is UNKNOWN:
        return UNKNOWN
    if task is None:
        return "none (a callback)"
    name = getattr(task, "get_name", None)
    return f"task {name()!r}" if callable(name) else UNKNOWN


class FrameNamer:
    """Names the place a thread's stack is at: its innermost frame of the project."""

    def __init__(self, packages: Sequence[str] = PROJECT_PACKAGES,
                 root: Path = PROJECT_ROOT) -> None:
        self._root = f"{root}{os.sep}"
        self._prefixes = tuple(f"{root / package}{os.sep}" for package in packages)

    def name(self, thread_id: int) -> str:
        frame = sys._current_frames().get(thread_id)
        if frame is None:
            return UNKNOWN
        innermost = frame
        found: FrameType | None = frame
        while found is not None and not found.f_code.co_filename.startswith(self._prefixes):
            found = found.f_back
        return self._describe(found if found is not None else innermost)

    def _describe(self, frame: FrameType) -> str:
        path = frame.f_code.co_filename.removeprefix(self._root)
        return f"{path}:{frame.f_lineno} ({frame.f_code.co_name})"


class _TickState:
    """What the tick and the watchdog share, changed under one lock (uncontended but
    for the instant the watchdog looks): when the tick is due, and the stall named."""

    def __init__(self, due: float) -> None:
        self._lock = threading.Lock()
        self.due = due
        self._named: float | None = None  # the due time of the stall the watchdog named
        self._named_lag = 0.0

    def ticked(self, due: float, now: float, next_due: float) -> None:
        with self._lock:
            self.due = next_due
            if due == self._named:
                self._named_lag = now - due

    def name_stall(self, due: float) -> bool:
        """Whether the tick due at ``due`` is still waiting; it is then the named stall."""
        with self._lock:
            if self.due != due:
                return False
            self._named = due
            return True

    def named_stall_end(self) -> float | None:
        """The named stall's whole lag once the tick ran, else None (or none named)."""
        with self._lock:
            if self._named is None or self.due == self._named:
                return None
            self._named = None
            return self._named_lag


class LoopLagMonitor:
    """The tick (``run``, a task of the loop it watches) and its watchdog thread."""

    def __init__(self, histogram: Histogram, *, interval_s: float = DEFAULT_INTERVAL_S,
                 warn_after_s: float = DEFAULT_WARN_AFTER_S,
                 switch_interval_s: float = DEFAULT_SWITCH_INTERVAL_S,
                 frames: FrameNamer | None = None) -> None:
        if interval_s <= 0 or warn_after_s <= 0 or switch_interval_s <= 0:
            raise ValueError("interval_s, warn_after_s and switch_interval_s must be positive")
        self.interval_s = interval_s
        self.warn_after_s = warn_after_s
        self.switch_interval_s = switch_interval_s
        self.frames = frames or FrameNamer()
        self._histogram = histogram
        # time.monotonic, not loop.time(): uvloop's clock stands still while the loop is
        # held, and the watchdog must see time pass.
        self.state = _TickState(time.monotonic() + interval_s)

    async def run(self) -> None:
        """Tick until cancelled, with the watchdog running beside, and the process's GIL
        switch interval at ``switch_interval_s`` (restored after)."""
        watchdog = _Watchdog(self, asyncio.get_running_loop(), threading.get_ident())
        self.state = _TickState(time.monotonic() + self.interval_s)
        switch_interval_s = sys.getswitchinterval()
        sys.setswitchinterval(self.switch_interval_s)
        watchdog.start()
        try:
            while True:
                due = self.state.due
                await asyncio.sleep(due - time.monotonic())
                now = time.monotonic()
                self.state.ticked(due, now, now + self.interval_s)
                self._histogram.observe(max(0.0, now - due))
        finally:
            watchdog.stop()
            sys.setswitchinterval(switch_interval_s)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """``run`` as a task of this loop for the span of the context."""
        task = asyncio.create_task(self.run(), name="loop-lag")
        try:
            yield
        finally:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task


class _Watchdog:
    """A daemon thread that names who holds the loop while the tick is overdue."""

    def __init__(self, monitor: LoopLagMonitor, loop: asyncio.AbstractEventLoop,
                 loop_thread: int) -> None:
        self._monitor, self._loop, self._loop_thread = monitor, loop, loop_thread
        # How often the end of a named stall is looked for.
        self._poll_s = monitor.warn_after_s / 4
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loop-lag-watchdog",
                                        daemon=True)
        self._holder: str | None = None  # who held the loop in the stall named

    def start(self) -> None:
        try:
            self._thread.start()
        except RuntimeError as exc:  # no thread left: the lag is still measured
            log.warning("event-loop watchdog not started (%s): stalls go unnamed", exc)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)

    def _watch(self) -> None:
        try:
            while not self._stopped.wait(self._next_look_s()):
                self._check()
        except Exception:  # a broken watchdog must not take the service along
            log.exception("event-loop watchdog failed; stalls go unnamed from now on")

    def _next_look_s(self) -> float:
        """Until the tick now awaited would be past the threshold (a loop that ticks on
        time wakes this thread about once a tick), or a poll while a stall is named."""
        if self._holder is not None:
            return self._poll_s
        due = self._monitor.state.due + self._monitor.warn_after_s
        return max(_MIN_LOOK_S, due - time.monotonic() + _MIN_LOOK_S)

    def _check(self) -> None:
        state = self._monitor.state
        if self._holder is not None:
            lag = state.named_stall_end()
            if lag is not None:
                log.warning("event loop was held for %.2f s in all (by %s)", lag,
                            self._holder)
                self._holder = None
            return
        due = state.due
        if time.monotonic() - due <= self._monitor.warn_after_s:
            return
        holder = (f"{running_task_name(self._loop)} at "
                  f"{self._monitor.frames.name(self._loop_thread)}")
        held = time.monotonic() - due
        if state.name_stall(due):  # still held, so the holder named is the one
            log.warning("event loop held for %.2f s so far by %s", held, holder)
            self._holder = holder
