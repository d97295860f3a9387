"""The ``tenants`` table: a tenant's name and the revision of its routing rules."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from registry_service.db.base import Base, UTCDateTime, utcnow


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # The revision of the tenant's routing rules: one more per rule change, carried by
    # its route_changed event, so agents can apply changes in place and see gaps.
    route_revision: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
