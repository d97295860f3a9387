"""Structural checks that a piece of work, the agent's or the registry's, gives the
event loop back: a probe task that is always ready records each loop turn it gets, and
the work records each unit it does, in one shared log. Units done back to back with no
probe turn between them ran in one step of the loop. Counts of turns, never durations."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

PROBE = "probe"
T = TypeVar("T")


@asynccontextmanager
async def probing(log: list[str]) -> AsyncIterator[None]:
    """Append ``PROBE`` to ``log`` at every loop turn the probe gets, for the block."""

    async def probe() -> None:
        while True:
            log.append(PROBE)
            await asyncio.sleep(0)

    task = asyncio.create_task(probe())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def longest_run(log: list[str], unit: str) -> int:
    """The most ``unit`` entries in a row with no probe turn between them."""
    longest = current = 0
    for entry in log:
        current = current + 1 if entry == unit else 0 if entry == PROBE else current
        longest = max(longest, current)
    return longest


def recording_thread(fn: Callable[..., T], threads: list[threading.Thread]
                     ) -> Callable[..., T]:
    """``fn``, noting in ``threads`` the thread each call runs on."""

    def wrapper(*args: Any, **kwargs: Any) -> T:
        threads.append(threading.current_thread())
        return fn(*args, **kwargs)
    return wrapper
