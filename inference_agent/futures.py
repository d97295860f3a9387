"""Small helpers for asyncio futures the agent starts and may never await."""

from __future__ import annotations

import asyncio
from typing import Any


def retrieve_exception(future: asyncio.Future[Any]) -> None:
    """A done callback: marks the future's error as seen, so asyncio does not log
    "exception was never retrieved" when every awaiter went away; whoever awaited it
    got the error already."""
    if not future.cancelled():
        future.exception()
