from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class AliasMoveRequest(BaseModel):
    version: int = Field(gt=0)
    expected_revision: int | None = Field(default=None, ge=0)


class RollbackRequest(BaseModel):
    expected_revision: int | None = Field(default=None, ge=0)


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


class AliasHistory(BaseModel):
    adapter: str
    alias: str
    moves: list[AliasMoveOut]
