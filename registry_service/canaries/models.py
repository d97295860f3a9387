"""The ``canaries`` table: one row per canary an alias ever ran, its state and checks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from registry_service.db.base import Base, UTCDateTime, utcnow

# At most one canary per alias is progressing or paused: the alias's row lock
# serializes starts, and this index refuses a second one should anything slip past.
_ACTIVE = text("state IN ('progressing', 'paused')")


class CanaryRow(Base):
    """A canary of one alias: ``canary_version`` on ``weight`` percent of its traffic,
    ``stable_version`` on the rest. Finished canaries stay, for the list."""

    __tablename__ = "canaries"
    __table_args__ = (
        Index("ix_canaries_alias_id_id", "alias_id", "id"),
        Index("uq_canaries_active_alias", "alias_id", unique=True,
              postgresql_where=_ACTIVE, sqlite_where=_ACTIVE),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    alias_id: Mapped[int] = mapped_column(ForeignKey("aliases.id"))
    stable_version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"))
    canary_version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"))
    state: Mapped[str] = mapped_column(String(16))
    step: Mapped[int] = mapped_column(Integer)
    weight: Mapped[int] = mapped_column(Integer)
    steps: Mapped[list[int]] = mapped_column(JSON)
    step_seconds: Mapped[int] = mapped_column(Integer)
    analysis: Mapped[dict[str, Any]] = mapped_column(JSON)
    on_failure: Mapped[str] = mapped_column(String(16))
    checks: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    actor: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # When the current step began: its analysis window opens here.
    step_started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
