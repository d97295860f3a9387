from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from loraplane.events import FileRef
from registry_service.aliases.schemas import AliasState


class VersionOut(BaseModel):
    adapter: str
    version: int
    digest: str
    base_model: str
    rank: int
    alpha: float
    target_modules: list[str]
    files: list[FileRef]
    total_size: int
    uploader: str
    notes: str
    created_at: datetime


class UploadResult(VersionOut):
    created: bool
    aliases: list[AliasState]


class VersionPage(BaseModel):
    versions: list[VersionOut]
    next_cursor: str | None
