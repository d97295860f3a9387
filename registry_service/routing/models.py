from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from registry_service.db.base import Base, UTCDateTime, utcnow


class RouteRuleRow(Base):
    """customer -> adapter, task -> adapter, or a default, resolved by the agents."""

    __tablename__ = "routing_rules"
    __table_args__ = (UniqueConstraint("kind", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(String(255))
    adapter_id: Mapped[int] = mapped_column(ForeignKey("adapters.id"))
    alias: Mapped[str] = mapped_column(String(63))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
