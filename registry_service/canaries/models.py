"""The ``canaries`` table: one row per canary an alias ever ran, its state and checks;
and ``canary_traffic``: what each agent served on each side of a running canary."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from registry_service.db.base import Base, UTCDateTime, utcnow

# At most one canary per alias is progressing or paused: the alias's row lock
# serializes starts, and this index refuses a second one should anything slip past.
_ACTIVE = text("state IN ('progressing', 'paused')")


class CanaryRow(Base):
    """A canary of one alias: ``canary_version`` on ``weight`` percent of its traffic,
    ``stable_version`` on the rest. Finished canaries stay, for the list."""

    __tablename__ = "canaries"
    __table_args__ = (
        Index("ix_canaries_alias_id_id", "alias_id", "id"),
        Index("uq_canaries_active_alias", "alias_id", unique=True,
              postgresql_where=_ACTIVE, sqlite_where=_ACTIVE),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    alias_id: Mapped[int] = mapped_column(ForeignKey("aliases.id"))
    stable_version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"))
    canary_version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"))
    state: Mapped[str] = mapped_column(String(16))
    step: Mapped[int] = mapped_column(Integer)
    weight: Mapped[int] = mapped_column(Integer)
    steps: Mapped[list[int]] = mapped_column(JSON)
    step_seconds: Mapped[int] = mapped_column(Integer)
    analysis: Mapped[dict[str, Any]] = mapped_column(JSON)
    on_failure: Mapped[str] = mapped_column(String(16))
    checks: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    actor: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # When the current step began (it is judged step_seconds later), and when its
    # window of metrics opened: the same, but for an inconclusive step watched again,
    # whose window goes on growing.
    step_started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    window_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=utcnow)
    # Failed steps so far, and inconclusive steps in a row (the analysis' limits).
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    inconclusive: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Who ended it (a user's name, or the analysis'), once it has ended.
    ended_by: Mapped[str | None] = mapped_column(String(255), default=None)
    # The registry replica analysing it, until when (a lease, as the outbox relay's).
    analyst: Mapped[str | None] = mapped_column(String(255), default=None)
    analyst_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)


class CanaryTrafficRow(Base):
    """One side (``stable`` or ``canary``) of a canary as one agent served it.

    The counts are the agent's, cumulative as reported; ``base_*`` are what they were
    when the step's window opened, so the window holds their difference. An agent that
    restarted reports lower counts: the difference it had is kept by lowering the base.
    Load failures have no base: a version that failed to load still fails there."""

    __tablename__ = "canary_traffic"

    canary_id: Mapped[int] = mapped_column(
        ForeignKey("canaries.id", ondelete="CASCADE"), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    track: Mapped[str] = mapped_column(String(8), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    errors: Mapped[int] = mapped_column(BigInteger, default=0)
    load_failures: Mapped[int] = mapped_column(BigInteger, default=0)
    latency: Mapped[list[int]] = mapped_column(JSON)
    ttft: Mapped[list[int]] = mapped_column(JSON)
    base_requests: Mapped[int] = mapped_column(BigInteger, default=0)
    base_errors: Mapped[int] = mapped_column(BigInteger, default=0)
    base_latency: Mapped[list[int] | None] = mapped_column(JSON, default=None)
    base_ttft: Mapped[list[int] | None] = mapped_column(JSON, default=None)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
