"""Versions: ``/v1/adapters/{name}/versions``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from loraplane.api.aliases import AliasState
from loraplane.events import VersionRef


class VersionOut(VersionRef):
    """A version as listed: what an agent needs to load it, and who uploaded it when."""

    total_size: int
    uploader: str
    notes: str
    created_at: datetime


class UploadResult(VersionOut):
    created: bool
    aliases: list[AliasState]
    # What the registry accepted without fully checking it (e.g. a config that names a
    # local path as its base model); shown to the publisher, not stored.
    warnings: list[str] = []
    # Checks that passed and are worth telling (e.g. shapes judged against the base
    # model's config although adapter_config.json names another base model).
    checks: list[str] = []
    # True when the tensors' shapes differ from the adapter's current versions' and the
    # upload was accepted only because it sent allow_shape_change.
    shape_change_allowed: bool = False


class VersionPage(BaseModel):
    versions: list[VersionOut]
    next_cursor: str | None
