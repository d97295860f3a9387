"""Routing rules from a customer or task header to an adapter: ``/v1/routes``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from loraplane.events import RouteRule
from loraplane.naming import DEFAULT_ALIAS


class RoutePut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    adapter: str = Field(min_length=1, max_length=63)
    alias: str = Field(default=DEFAULT_ALIAS, min_length=1, max_length=63)


class RouteOut(RouteRule):
    """A rule as agents receive it, with the time it was last set."""

    updated_at: datetime


class RouteList(BaseModel):
    routes: list[RouteOut]
