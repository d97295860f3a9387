from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from registry_service.db.base import Base, UTCDateTime, utcnow
from registry_service.tenants.models import Tenant


class ApiToken(Base):
    """A bearer token. Only its sha256 is stored; the secret is shown once."""

    __tablename__ = "api_tokens"
    # An agent id is bound to one token at most, revoked ones included: a revoked
    # token's binding is freed by a global admin only (auth/service.py).
    __table_args__ = (Index("uq_api_tokens_agent_id", "agent_id", unique=True),)

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
    # id it reports as; and that id is its alone (the unique index). NULL for other
    # roles, for an agent token not used yet, and once a global admin freed the id.
    agent_id: Mapped[str | None] = mapped_column(String(255), default=None)

    tenant: Mapped[Tenant | None] = relationship(lazy="joined")
