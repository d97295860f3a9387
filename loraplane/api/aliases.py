"""Aliases, the only mutable pointers: ``/v1/adapters/{name}/aliases``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from loraplane.api.bounds import Revision, VersionNumber


class AliasMoveRequest(BaseModel):
    version: VersionNumber
    expected_revision: Revision | None = None
    # A canary running on the alias refuses the move (409 ``canary_running``) unless
    # this aborts it first.
    abort_canary: bool = False


class RollbackRequest(BaseModel):
    expected_revision: Revision | None = None
    abort_canary: bool = False


class AliasState(BaseModel):
    adapter: str
    alias: str
    version: int | None
    previous_version: int | None
    revision: int
    changed: bool


class AliasMoveOut(BaseModel):
    revision: int
    action: str
    from_version: int | None
    to_version: int | None
    actor: str
    created_at: datetime
    reason: str | None = None


class AliasHistory(BaseModel):
    adapter: str
    alias: str
    moves: list[AliasMoveOut]
    # The revision to pass as ``cursor`` for the older moves; None on the last page.
    next_cursor: str | None = None
