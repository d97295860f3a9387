"""The bodies of the page's JSON endpoints (``/ui/api``); only the page reads them."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from loraplane.api.adapters import AdapterOut
from loraplane.api.agents import RolloutOut
from loraplane.api.canaries import Canary
from loraplane.api.versions import VersionOut


class SignedIn(BaseModel):
    """Who the page's token is: what the header shows and what the page may offer."""

    name: str
    role: str
    tenant: str | None
    # Whether the page offers promote and rollback, and its canaries' pause, resume,
    # promote and abort (all need a publisher); the registry checks every call anyway.
    can_move_aliases: bool


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


def fleet_json(rollouts: Iterable[str]) -> str:
    """``Fleet(adapters=...).model_dump_json()``, from each adapter's own JSON: written an
    adapter at a time, so that no one call holds the GIL long."""
    return '{"adapters":[' + ",".join(rollouts) + "]}"


class RunningCanaries(BaseModel):
    """Every progressing or paused canary of the adapters the token may read, by adapter
    and alias, each with its current step's checks so far (``live_checks``)."""

    canaries: list[Canary]


def canaries_json(canaries: Iterable[Canary]) -> str:
    """``RunningCanaries(canaries=...).model_dump_json()``."""
    return '{"canaries":[' + ",".join(c.model_dump_json() for c in canaries) + "]}"


class VersionDetails(VersionOut):
    """A version as the page shows it: the listing plus its ``adapter_config.json``."""

    # None when the file could not be read (a store outage): the rest still shows.
    config: dict[str, Any] | None


class ConfigChange(BaseModel):
    key: str
    change: Literal["added", "removed", "changed"]
    before: Any = None
    after: Any = None


class FileChange(BaseModel):
    name: str
    change: Literal["added", "removed", "changed", "same"]
    before_size: int | None
    after_size: int | None


class VersionDiff(BaseModel):
    """What changed from version ``base`` to version ``head`` of one adapter."""

    adapter: str
    base: int
    head: int
    # None when either config could not be read.
    config: list[ConfigChange] | None
    files: list[FileChange]
    base_size: int
    head_size: int
