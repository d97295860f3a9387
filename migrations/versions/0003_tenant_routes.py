"""routing rules belong to a tenant: unique per (tenant, kind, key)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 14:30:00

Existing rules are carried over to the tenant of the adapter they name. A tenant now
has at most one default rule, under the key ``default``: where a tenant had several,
the one whose key sorts lowest (the one agents used among that tenant's) is kept and
the others are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FILL_TENANT = """
UPDATE routing_rules SET tenant_id = (
    SELECT adapters.tenant_id FROM adapters WHERE adapters.id = routing_rules.adapter_id)
"""
_ONE_DEFAULT_PER_TENANT = """
DELETE FROM routing_rules WHERE kind = 'default' AND EXISTS (
    SELECT 1 FROM routing_rules AS other
    WHERE other.kind = 'default' AND other.tenant_id = routing_rules.tenant_id
      AND other.key < routing_rules.key)
"""
_DEFAULT_KEY = "UPDATE routing_rules SET key = 'default' WHERE kind = 'default'"
# Back to one namespace for every tenant: the oldest rule of each (kind, key) stays.
_ONE_RULE_PER_KEY = """
DELETE FROM routing_rules WHERE EXISTS (
    SELECT 1 FROM routing_rules AS other
    WHERE other.kind = routing_rules.kind AND other.key = routing_rules.key
      AND other.id < routing_rules.id)
"""


def upgrade() -> None:
    with op.batch_alter_table("routing_rules", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tenant_id", sa.Integer(), nullable=True))
    op.execute(_FILL_TENANT)
    op.execute(_ONE_DEFAULT_PER_TENANT)
    with op.batch_alter_table("routing_rules", schema=None) as batch_op:
        batch_op.alter_column("tenant_id", existing_type=sa.Integer(), nullable=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_routing_rules_tenant_id_tenants"), "tenants", ["tenant_id"], ["id"])
        batch_op.drop_constraint("uq_routing_rules_kind_key", type_="unique")
        batch_op.create_unique_constraint(
            batch_op.f("uq_routing_rules_tenant_id_kind_key"), ["tenant_id", "kind", "key"])
    # Only once two tenants' defaults no longer share the old (kind, key) constraint.
    op.execute(_DEFAULT_KEY)


def downgrade() -> None:
    op.execute(_ONE_RULE_PER_KEY)
    with op.batch_alter_table("routing_rules", schema=None) as batch_op:
        batch_op.drop_constraint("uq_routing_rules_tenant_id_kind_key", type_="unique")
        batch_op.drop_constraint("fk_routing_rules_tenant_id_tenants", type_="foreignkey")
        batch_op.drop_column("tenant_id")
        batch_op.create_unique_constraint("uq_routing_rules_kind_key", ["kind", "key"])
