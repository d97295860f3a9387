"""Reading the /ui live stream over real HTTP, one server-sent event at a time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

WAIT_S = 30.0


class Frames:
    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_text()
        self._buffer = ""

    async def _frame(self) -> tuple[str, str]:
        while "\n\n" not in self._buffer:
            self._buffer += await anext(self._chunks)
        block, self._buffer = self._buffer.split("\n\n", 1)
        event, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        return event, "\n".join(data)

    async def next(self, *events: str) -> tuple[str, Any]:
        """The next event of one of ``events`` (others are passed over), as parsed JSON."""
        async with asyncio.timeout(WAIT_S):
            while True:
                event, data = await self._frame()
                if event in events:
                    return event, json.loads(data)


@asynccontextmanager
async def live(url: str, headers: dict[str, str]) -> AsyncIterator[Frames]:
    async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client, \
            client.stream("GET", "/ui/api/stream", headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        yield Frames(response)
