from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from registry_service.db.base import Base, UTCDateTime, utcnow
from registry_service.tenants.models import Tenant


class ApiToken(Base):
    """A bearer token. Only its sha256 is stored; the secret is shown once."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    role: Mapped[str] = mapped_column(String(16))
    # NULL means global (every tenant): admins and agents.
    tenant_id: Mapped[int | None] = mapped_column(ForeignKey("tenants.id"), default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    # An agent token speaks for one agent: the id it was made for, or else the first
    # id it reports as. NULL for other roles, and for an agent token not used yet.
    agent_id: Mapped[str | None] = mapped_column(String(255), default=None)

    tenant: Mapped[Tenant | None] = relationship(lazy="joined")
