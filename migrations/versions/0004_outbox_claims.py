"""outbox rows carry a relay's claim, so no transaction spans a publish

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 14:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claimed_by", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_column("claimed_until")
        batch_op.drop_column("claimed_by")
