"""The audit log's page: the wire contract lives in the shared core."""

from __future__ import annotations

from loraplane.api.events import DEFAULT_PAGE, MAX_PAGE, EventPage

__all__ = ["DEFAULT_PAGE", "MAX_PAGE", "EventPage"]
