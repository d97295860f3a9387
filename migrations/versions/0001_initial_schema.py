"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 02:33:49.463749
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "agents",
        sa.Column("agent_id", sa.String(length=255), nullable=False),
        sa.Column("base_model", sa.String(length=255), nullable=False),
        sa.Column("status", sa.JSON(), nullable=False),
        sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("agent_id", name=op.f("pk_agents")),
    )
    op.create_table(
        "events",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("event_id", sa.String(length=36), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("adapter", sa.String(length=63), nullable=False),
        sa.Column("subject", sa.String(length=255), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stream_seq", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_events")),
        sa.UniqueConstraint("event_id", name=op.f("uq_events_event_id")),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_unpublished", ["published_at", "seq"], unique=False)

    op.create_table(
        "tenants",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "adapters",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("base_model", sa.String(length=255), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("last_version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_adapters_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapters")),
        sa.UniqueConstraint("name", name=op.f("uq_adapters_name")),
    )
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.create_index("ix_adapters_tenant_base", ["tenant_id", "base_model"], unique=False)

    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_tokens_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_table(
        "routing_rules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("adapter_id", sa.Integer(), nullable=False),
        sa.Column("alias", sa.String(length=63), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["adapter_id"], ["adapters.id"], name=op.f("fk_routing_rules_adapter_id_adapters")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_routing_rules")),
        sa.UniqueConstraint("kind", "key", name=op.f("uq_routing_rules_kind_key")),
    )
    op.create_table(
        "versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("adapter_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("total_size", sa.BigInteger(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("alpha", sa.Float(), nullable=False),
        sa.Column("target_modules", sa.JSON(), nullable=False),
        sa.Column("uploader", sa.String(length=255), nullable=False),
        sa.Column("notes", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["adapter_id"], ["adapters.id"], name=op.f("fk_versions_adapter_id_adapters")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_versions")),
        sa.UniqueConstraint("adapter_id", "digest", name=op.f("uq_versions_adapter_id_digest")),
        sa.UniqueConstraint("adapter_id", "number", name=op.f("uq_versions_adapter_id_number")),
    )
    op.create_table(
        "aliases",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("adapter_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=True),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["adapter_id"], ["adapters.id"], name=op.f("fk_aliases_adapter_id_adapters")
        ),
        sa.ForeignKeyConstraint(
            ["version_id"], ["versions.id"], name=op.f("fk_aliases_version_id_versions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_aliases")),
        sa.UniqueConstraint("adapter_id", "name", name=op.f("uq_aliases_adapter_id_name")),
    )
    op.create_table(
        "alias_moves",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("alias_id", sa.Integer(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("from_version_id", sa.Integer(), nullable=True),
        sa.Column("to_version_id", sa.Integer(), nullable=True),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["alias_id"], ["aliases.id"], name=op.f("fk_alias_moves_alias_id_aliases")
        ),
        sa.ForeignKeyConstraint(
            ["from_version_id"],
            ["versions.id"],
            name=op.f("fk_alias_moves_from_version_id_versions"),
        ),
        sa.ForeignKeyConstraint(
            ["to_version_id"], ["versions.id"], name=op.f("fk_alias_moves_to_version_id_versions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alias_moves")),
    )
    with op.batch_alter_table("alias_moves", schema=None) as batch_op:
        batch_op.create_index(
            "ix_alias_moves_alias_revision", ["alias_id", "revision"], unique=False
        )


def downgrade() -> None:

    with op.batch_alter_table("alias_moves", schema=None) as batch_op:
        batch_op.drop_index("ix_alias_moves_alias_revision")

    op.drop_table("alias_moves")
    op.drop_table("aliases")
    op.drop_table("versions")
    op.drop_table("routing_rules")
    op.drop_table("api_tokens")
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.drop_index("ix_adapters_tenant_base")

    op.drop_table("adapters")
    op.drop_table("tenants")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_unpublished")

    op.drop_table("events")
    op.drop_table("agents")
