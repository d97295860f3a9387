"""The ``events`` table: the transactional outbox and the audit log in one."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from registry_service.db.base import Base, UTCDateTime, utcnow


class EventRow(Base):
    """The transactional outbox and the audit log in one table.

    ``seq`` is the global order. The relay publishes rows with ``published_at`` NULL
    and records the JetStream sequence it got back. ``claimed_by`` and ``claimed_until``
    are a relay's lease on an unpublished row: it publishes outside any transaction, and
    a lease that runs out (a relay that died) lets another relay publish the row.
    """

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_unpublished", "published_at", "seq"),)

    seq: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    event_id: Mapped[str] = mapped_column(String(36), unique=True)
    type: Mapped[str] = mapped_column(String(32))
    tenant: Mapped[str] = mapped_column(String(63))
    adapter: Mapped[str] = mapped_column(String(63))
    subject: Mapped[str] = mapped_column(String(255))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    actor: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    stream_seq: Mapped[int | None] = mapped_column(BigInteger, default=None)
    claimed_by: Mapped[str | None] = mapped_column(String(64), default=None)
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
