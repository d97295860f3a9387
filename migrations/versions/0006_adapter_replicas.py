"""adapter placement: how many agents keep an adapter hot

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 20:20:00

A nullable column: existing adapters keep no placement (every agent serving them,
loaded on demand), as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("adapters", sa.Column("replicas", sa.Integer(), nullable=True))


def downgrade() -> None:
    # Plain ALTER on both databases (SQLite has it since 3.35): batch mode's table copy
    # would trip the foreign keys that point at adapters.
    op.execute("ALTER TABLE adapters DROP COLUMN replicas")
