"""The bodies of the page's JSON endpoints (``/ui/api``); only the page reads them."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from loraplane.api.adapters import AdapterOut
from loraplane.api.agents import RolloutOut


class SignedIn(BaseModel):
    """Who the page's token is: what the header shows and what the page may offer."""

    name: str
    role: str
    tenant: str | None


class TimelineEntry(BaseModel):
    """An upload (``kind`` "version") or a move of an alias (``kind`` "move")."""

    kind: Literal["version", "move"]
    at: datetime
    actor: str
    version: int | None = None
    # The version's notes, for an upload.
    notes: str = ""
    digest: str | None = None
    total_size: int | None = None
    alias: str | None = None
    # What made the move, its reason: publish (an upload named the alias), promote,
    # rollback, delete or adapter_deleted.
    action: str | None = None
    from_version: int | None = None
    to_version: int | None = None
    revision: int | None = None


class Timeline(BaseModel):
    adapter: AdapterOut
    entries: list[TimelineEntry]
    truncated: bool


class Fleet(BaseModel):
    adapters: list[RolloutOut]
