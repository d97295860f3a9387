"""canary analysis: per-agent traffic of each side, the step counters and the lease

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 22:00:00

``canary_traffic`` holds what each agent reported of each side of a canary (cumulative)
and what it was when the step's window opened. ``canaries`` gains the analysis' failed
and inconclusive step counts, who ended it (``ended_by``), when its window of metrics
opened (``window_started_at``) and the analyst's lease (``analyst``, ``analyst_until``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WINDOWED = ("requests", "errors")


def upgrade() -> None:
    # Columns only added (no table rebuilt: SQLite would lose the partial index).
    with op.batch_alter_table("canaries") as batch:
        batch.add_column(sa.Column("failures", sa.Integer(), nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("inconclusive", sa.Integer(), nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("ended_by", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("window_started_at", sa.DateTime(timezone=True),
                                   nullable=True))
        batch.add_column(sa.Column("analyst", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("analyst_until", sa.DateTime(timezone=True),
                                   nullable=True))
    op.execute("UPDATE canaries SET window_started_at = step_started_at")
    op.create_table(
        "canary_traffic",
        sa.Column("canary_id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.String(length=255), nullable=False),
        sa.Column("track", sa.String(length=8), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False)
          for name in (*_WINDOWED, "load_failures")),
        sa.Column("latency", sa.JSON(), nullable=False),
        sa.Column("ttft", sa.JSON(), nullable=False),
        *(sa.Column(f"base_{name}", sa.BigInteger(), nullable=False) for name in _WINDOWED),
        sa.Column("base_latency", sa.JSON(), nullable=True),
        sa.Column("base_ttft", sa.JSON(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["canary_id"], ["canaries.id"], ondelete="CASCADE",
                                name=op.f("fk_canary_traffic_canary_id_canaries")),
        sa.PrimaryKeyConstraint("canary_id", "agent_id", "track",
                                name=op.f("pk_canary_traffic")),
    )


def downgrade() -> None:
    op.drop_table("canary_traffic")
    with op.batch_alter_table("canaries") as batch:
        for name in ("analyst_until", "analyst", "window_started_at", "ended_by",
                     "inconclusive", "failures"):
            batch.drop_column(name)
