"""One asyncio task a registry component runs from ``start`` until ``stop``."""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

log = logging.getLogger(__name__)

# How long a task that failed with an OSError waits before its loop starts again.
RESTART_DELAY_S = 1.0


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended."""
    if task is not None:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


class BackgroundTask:
    """Subclasses implement ``_run`` (usually a loop) and name the task.

    ``_run`` failing with an ``OSError`` (no descriptor left: EMFILE, a full disk) is
    logged and ``_run`` starts again after ``restart_delay_s``: a passing state of the
    host must not stop the component for the rest of the process's life."""

    task_name = "background"
    restart_delay_s = RESTART_DELAY_S
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._kept_running(), name=self.task_name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _kept_running(self) -> None:
        while True:
            try:
                await self._run()
                return
            except OSError as exc:
                log.error("%s failed: %s: %s; starting it again in %.1fs", self.task_name,
                          type(exc).__name__, exc, self.restart_delay_s)
                await asyncio.sleep(self.restart_delay_s)

    async def _run(self) -> None:
        raise NotImplementedError
