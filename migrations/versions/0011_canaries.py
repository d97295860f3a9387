"""canaries: a second version on an alias, with its weight, steps, checks and state

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 18:00:00

A new table; at most one canary per alias is progressing or paused (a partial unique
index, which both databases have). ``alias_moves.reason`` records why a canary's
transition happened.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ACTIVE = sa.text("state IN ('progressing', 'paused')")

def upgrade() -> None:
    op.create_table(
        "canaries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("alias_id", sa.Integer(), nullable=False),
        sa.Column("stable_version_id", sa.Integer(), nullable=False),
        sa.Column("canary_version_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.Column("steps", sa.JSON(), nullable=False),
        sa.Column("step_seconds", sa.Integer(), nullable=False),
        sa.Column("analysis", sa.JSON(), nullable=False),
        sa.Column("on_failure", sa.String(length=16), nullable=False),
        sa.Column("checks", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("step_started_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["alias_id"], ["aliases.id"],
                                name=op.f("fk_canaries_alias_id_aliases")),
        sa.ForeignKeyConstraint(["stable_version_id"], ["versions.id"],
                                name=op.f("fk_canaries_stable_version_id_versions")),
        sa.ForeignKeyConstraint(["canary_version_id"], ["versions.id"],
                                name=op.f("fk_canaries_canary_version_id_versions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_canaries")),
    )
    op.create_index("ix_canaries_alias_id_id", "canaries", ["alias_id", "id"])
    op.create_index("uq_canaries_active_alias", "canaries", ["alias_id"], unique=True,
                    postgresql_where=_ACTIVE, sqlite_where=_ACTIVE)

    op.add_column("alias_moves", sa.Column("reason", sa.Text(), nullable=True))


def downgrade() -> None:
    # Plain ALTER on both databases (SQLite has it since 3.35), as in 0006.
    op.execute("ALTER TABLE alias_moves DROP COLUMN reason")
    op.drop_table("canaries")
