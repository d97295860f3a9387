"""version_blobs: the digests each version names, for the blob collector's probe

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29 10:00:00

The collector used to read every version's ``files`` JSON to learn which blobs are
named. This table holds one row per distinct digest of a version's files, keyed by the
digest first, so the collector asks the database about one page of stored blobs at a
time. The rows of existing versions are filled in here, by the database itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Every distinct digest each version's files name; a file without one names nothing.
_BACKFILL = {
    "postgresql": (
        "INSERT INTO version_blobs (sha256, version_id) "
        "SELECT DISTINCT f.value ->> 'sha256', v.id FROM versions AS v "
        "CROSS JOIN LATERAL json_array_elements(v.files::json) AS f(value) "
        "WHERE f.value ->> 'sha256' IS NOT NULL"
    ),
    "sqlite": (
        "INSERT INTO version_blobs (sha256, version_id) "
        "SELECT DISTINCT json_extract(f.value, '$.sha256'), v.id FROM versions AS v, "
        "json_each(v.files) AS f "
        "WHERE json_extract(f.value, '$.sha256') IS NOT NULL"
    ),
}


def upgrade() -> None:
    op.create_table(
        "version_blobs",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["version_id"], ["versions.id"], name=op.f("fk_version_blobs_version_id_versions")
        ),
        sa.PrimaryKeyConstraint("sha256", "version_id", name=op.f("pk_version_blobs")),
    )
    op.execute(sa.text(_BACKFILL[op.get_context().dialect.name]))


def downgrade() -> None:
    op.drop_table("version_blobs")
