from __future__ import annotations

from typing import Any

from pydantic import BaseModel

DEFAULT_PAGE = 100
MAX_PAGE = 1000


class EventPage(BaseModel):
    """One page of the audit log; ask again with ``after=next_after`` for the next."""

    # Each item has the shape of the event published to JetStream (``event_json``).
    events: list[dict[str, Any]]
    next_after: int
