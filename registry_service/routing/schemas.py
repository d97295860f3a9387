from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from loraplane.events import RouteKind
from loraplane.naming import DEFAULT_ALIAS


class RoutePut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    adapter: str = Field(min_length=1, max_length=63)
    alias: str = Field(default=DEFAULT_ALIAS, min_length=1, max_length=63)


class RouteOut(BaseModel):
    kind: RouteKind
    key: str
    adapter: str
    alias: str
    tenant: str
    base_model: str
    updated_at: datetime


class RouteList(BaseModel):
    routes: list[RouteOut]
