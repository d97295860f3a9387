"""One asyncio task a registry component runs from ``start`` until ``stop``."""

from __future__ import annotations

import asyncio
from contextlib import suppress


class BackgroundTask:
    """Subclasses implement ``_run`` (usually a loop) and name the task."""

    task_name = "background"
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.task_name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        raise NotImplementedError
