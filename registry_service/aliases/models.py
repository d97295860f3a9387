"""The ``aliases`` table and the record of every move (``alias_moves``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from registry_service.db.base import Base, UTCDateTime, utcnow


class Alias(Base):
    """A mutable pointer to a version. ``revision`` orders its moves.

    A removed alias keeps its row with ``version_id`` NULL, so a later re-creation
    continues the revision count and agents can order every move.
    """

    __tablename__ = "aliases"
    __table_args__ = (UniqueConstraint("adapter_id", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    adapter_id: Mapped[int] = mapped_column(ForeignKey("adapters.id"))
    name: Mapped[str] = mapped_column(String(63))
    version_id: Mapped[int | None] = mapped_column(ForeignKey("versions.id"), default=None)
    revision: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AliasMove(Base):
    """One recorded move of an alias: push, promote, rollback, delete, or a transition
    of its canary."""

    __tablename__ = "alias_moves"
    __table_args__ = (Index("ix_alias_moves_alias_revision", "alias_id", "revision"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    alias_id: Mapped[int] = mapped_column(ForeignKey("aliases.id"))
    revision: Mapped[int] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(32))
    from_version_id: Mapped[int | None] = mapped_column(ForeignKey("versions.id"))
    to_version_id: Mapped[int | None] = mapped_column(ForeignKey("versions.id"))
    actor: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Why, where a canary's transition gives one.
    reason: Mapped[str | None] = mapped_column(Text, default=None)
