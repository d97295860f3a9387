"""The ``versions`` table: one immutable row per distinct content of an adapter."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from registry_service.db.base import Base, UTCDateTime, utcnow


class Version(Base):
    """An immutable adapter version. Identical content maps to the same row."""

    __tablename__ = "versions"
    __table_args__ = (
        # Also the index behind keyset pagination of the history, newest first.
        UniqueConstraint("adapter_id", "number"),
        UniqueConstraint("adapter_id", "digest"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    adapter_id: Mapped[int] = mapped_column(ForeignKey("adapters.id"))
    number: Mapped[int] = mapped_column(Integer)
    digest: Mapped[str] = mapped_column(String(64))
    # [{"name", "size", "sha256"}], sorted by name; the digest is computed over it.
    files: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    total_size: Mapped[int] = mapped_column(BigInteger)
    rank: Mapped[int] = mapped_column(Integer)
    alpha: Mapped[float] = mapped_column(Float)
    target_modules: Mapped[list[str]] = mapped_column(JSON)
    uploader: Mapped[str] = mapped_column(String(255))
    notes: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
