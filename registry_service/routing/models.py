"""The ``routing_rules`` table."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from registry_service.db.base import Base, UTCDateTime, utcnow


class RouteRuleRow(Base):
    """customer -> adapter, task -> adapter, or a tenant's default, resolved by the agents.

    A rule belongs to one tenant, the tenant of the adapter it names: two tenants may
    both route customer ``alice``, each to its own adapter, and a request only ever
    meets its own tenant's rules. ``tenant_id`` is kept on the row (not only through
    the adapter) so the database itself keeps ``(tenant, kind, key)`` unique.
    """

    __tablename__ = "routing_rules"
    __table_args__ = (UniqueConstraint("tenant_id", "kind", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    kind: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(String(255))
    adapter_id: Mapped[int] = mapped_column(ForeignKey("adapters.id"))
    alias: Mapped[str] = mapped_column(String(63))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
