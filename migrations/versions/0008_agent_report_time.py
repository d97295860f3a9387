"""agents.reported_at: the stored report's own time, beside the report

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 23:00:00

Every agent reports at every push, and a report is stored only if it is newer than the
one held. Reading that time out of the stored report made the database parse a JSON
document of hundreds of entries per report (and Postgres's ``->>`` refuses some escapes
that ``json`` columns accept). Rows stored before this revision have no time here; the
registry then reads it from the report, once, and the next write fills it in.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("agents", sa.Column("reported_at", sa.DateTime(timezone=True),
                                      nullable=True))


def downgrade() -> None:
    # Plain ALTER on both databases (SQLite has it since 3.35), as in 0006.
    op.execute("ALTER TABLE agents DROP COLUMN reported_at")
