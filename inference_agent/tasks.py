"""The agent's tasks: started again after a passing OSError, and cancelled for good at
shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

# How long a periodic task that failed with an OSError waits before it starts again.
RESTART_DELAY_S = 1.0


async def keep_running(name: str, run: Callable[[], Coroutine[Any, Any, Any]],
                       delay_s: float | None = None) -> None:
    """Run ``run()`` to its end, starting it again after ``delay_s`` whenever it fails
    with an ``OSError``: a descriptor limit reached (EMFILE) or a full disk is a passing
    state of the host, not a reason to end the agent, which a task of its TaskGroup
    ending with an error would."""
    while True:
        try:
            await run()
            return
        except OSError as exc:
            wait_s = RESTART_DELAY_S if delay_s is None else delay_s
            log.error("%s failed: %s: %s; starting it again in %.1fs", name,
                      type(exc).__name__, exc, wait_s)
            await asyncio.sleep(wait_s)


async def cancel_all(tasks: list[asyncio.Task[Any]], rounds: int = 10,
                     interval_s: float = 1.0) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again while any is left: under
    Python 3.11 a cancel can be lost inside a library's own ``wait_for``."""
    pending = {task for task in tasks if not task.done()}
    for _ in range(rounds):
        if not pending:
            return
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=interval_s)
    if pending:
        log.error("tasks still running after shutdown: %s",
                  ", ".join(sorted(task.get_name() for task in pending)))
