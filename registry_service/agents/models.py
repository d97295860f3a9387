from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, mapped_column

from registry_service.db.base import Base, UTCDateTime, utcnow


class AgentRow(Base):
    """An inference agent and the last status it reported."""

    __tablename__ = "agents"

    agent_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    base_model: Mapped[str] = mapped_column(String(255))
    status: Mapped[dict[str, Any]] = mapped_column(JSON)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # The stored report's own time (``status["time"]``), so that taking the next report
    # need not read the stored one; None on rows stored before migration 0008.
    reported_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
