"""Adapters: ``/v1/adapters``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from loraplane.api.text import SafeName
from loraplane.naming import SLUG_PATTERN


class AdapterCreate(BaseModel):
    name: str = Field(pattern=SLUG_PATTERN, description="a slug, unique in the registry")
    base_model: SafeName = Field(min_length=1, max_length=255)
    tenant: str | None = Field(default=None, pattern=SLUG_PATTERN)
    description: str = Field(default="", max_length=10_000)
    replicas: int | None = Field(
        default=None, description="how many agents keep it hot (rendezvous placement); "
                                  "absent or null: every agent serving it, loaded on demand")


class AdapterUpdate(BaseModel):
    """``PATCH /v1/adapters/{name}``: only the fields sent change."""

    replicas: int | None = Field(
        default=None, description="how many agents keep it hot; null clears the setting")
    description: str | None = Field(default=None, max_length=10_000)


class AliasOut(BaseModel):
    alias: str
    version: int | None
    revision: int
    updated_at: datetime


class AdapterOut(BaseModel):
    name: str
    tenant: str
    base_model: str
    description: str
    latest_version: int | None
    created_at: datetime
    replicas: int | None = None
    aliases: list[AliasOut] = []


class AdapterPage(BaseModel):
    adapters: list[AdapterOut]
    next_cursor: str | None
