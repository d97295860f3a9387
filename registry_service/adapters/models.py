"""The ``adapters`` table."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from registry_service.db.base import Base, UTCDateTime, utcnow
from registry_service.tenants.models import Tenant


class Adapter(Base):
    """An adapter: a name, a tenant and the one base model it was trained against.

    Deletion is soft: the name is retired, so ``name@N`` can never come back with
    other weights in some vLLM that still caches it.
    """

    __tablename__ = "adapters"
    __table_args__ = (Index("ix_adapters_tenant_base", "tenant_id", "base_model"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    base_model: Mapped[str] = mapped_column(String(255))
    description: Mapped[str] = mapped_column(Text, default="")
    # Version numbers are drawn from this counter with one atomic UPDATE, so
    # concurrent uploads get distinct numbers on both databases.
    last_version: Mapped[int] = mapped_column(Integer, default=0)
    # How many agents keep it hot (rendezvous placement); None: every agent that
    # serves it, on demand.
    replicas: Mapped[int | None] = mapped_column(Integer, default=None, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)

    tenant: Mapped[Tenant] = relationship(lazy="joined", innerjoin=True)
