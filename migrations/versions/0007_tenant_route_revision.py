"""routing rule revisions: each tenant numbers its rule changes

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 09:30:00

Every ``route_changed`` event carries the tenant's next revision, so an agent applies
it in place when it follows the one it holds and re-reads the rules on a gap. Existing
tenants start at 0, which agents read with the rules before any new event.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("route_revision", sa.Integer(), nullable=False,
                                       server_default="0"))


def downgrade() -> None:
    # Plain ALTER on both databases (SQLite has it since 3.35), as in 0006.
    op.execute("ALTER TABLE tenants DROP COLUMN route_revision")
