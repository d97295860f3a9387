"""``eventually``: wait for a condition, the one way tests, benchmarks and scripts do.

A check is a sync or async function without arguments. It answers "not yet" with None
or False; anything else is the answer, and ``eventually`` returns it. Checks are polled
at once, then with pauses that grow from a few milliseconds (an in-process state often
holds after one turn of the event loop) to ``interval_s`` (a check that asks a server
must not flood it).

``DEFAULT_TIMEOUT_S`` suits a loaded CI machine: two cores shared with vLLM on CPU and
other test runs, where a step that takes a second alone can take twenty. A timeout only
bounds how long a failing test takes to say so; a passing one returns at once.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_INTERVAL_S = 0.1
_FIRST_PAUSE_S = 0.005


class Unexpected(AssertionError):
    """Raised by a check to fail at once instead of waiting on."""


@overload
async def eventually(check: Callable[[], Awaitable[T | None]], *,
                     timeout_s: float = ..., what: str = ..., interval_s: float = ...,
                     retrying: tuple[type[Exception], ...] = ()) -> T: ...


@overload
async def eventually(check: Callable[[], T | None], *,
                     timeout_s: float = ..., what: str = ..., interval_s: float = ...,
                     retrying: tuple[type[Exception], ...] = ()) -> T: ...


async def eventually(check: Callable[[], object], *,
                     timeout_s: float = DEFAULT_TIMEOUT_S, what: str = "the condition",
                     interval_s: float = DEFAULT_INTERVAL_S,
                     retrying: tuple[type[Exception], ...] = ()) -> object:
    """Poll ``check`` until it returns something other than None or False; return that.

    An exception from ``check`` fails at once, unless it is one of ``retrying`` (then it
    counts as "not yet" and is shown if time runs out); ``Unexpected`` always fails at
    once. After ``timeout_s`` an ``AssertionError`` names ``what`` was awaited and the
    check's last answer.
    """
    deadline = time.monotonic() + timeout_s
    pause = min(_FIRST_PAUSE_S, interval_s)
    last: object = None
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
        except Unexpected:
            raise
        except retrying as exc:
            value, last = None, exc
        else:
            last = value
        if value is not None and value is not False:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not reached within {timeout_s:g}s "
                                 f"(the check last gave {last!r})")
        await asyncio.sleep(pause)
        pause = min(pause * 2, interval_s)
