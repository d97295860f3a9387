"""blob leases: uploads in flight protect their blobs from the garbage collector

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 14:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "blob_leases",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("held_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("holders", sa.Integer(), nullable=False),
        sa.Column("collecting_until", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_blob_leases")),
    )


def downgrade() -> None:
    op.drop_table("blob_leases")
