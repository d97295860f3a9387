"""an agent id is bound to one token: a unique index on api_tokens.agent_id

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28 10:00:00

Before this revision a token was bound to one agent id, but an id was not bound to one
token: a second agent token could first report as an id another token held, and then
replace that agent's status. Rows of such a database may hold one id on several tokens;
the index needs one. The holder kept is the oldest live token (the first to bind it, as
the new rule would have had it), else the newest revoked one. The others lose the id
and nothing else: a migration revokes no credential (a live one may be the one an agent
uses since a token rotation). A live token left unbound is an agent token like a new
one: its next report binds a free id, or is refused for a bound one (403
agent_id_bound), which an operator sees and settles by revoking the token it should
not use. Each live one is named in a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("alembic.runtime.migration")

_TOKENS = sa.table("api_tokens", sa.column("id", sa.Integer), sa.column("agent_id", sa.String),
                   sa.column("revoked_at", sa.DateTime(timezone=True)))


def _resolve_duplicates(conn: sa.Connection) -> None:
    shared = conn.execute(
        sa.select(_TOKENS.c.agent_id).where(_TOKENS.c.agent_id.is_not(None))
        .group_by(_TOKENS.c.agent_id).having(sa.func.count() > 1)).scalars().all()
    for agent_id in shared:
        rows = conn.execute(sa.select(_TOKENS.c.id, _TOKENS.c.revoked_at)
                            .where(_TOKENS.c.agent_id == agent_id)
                            .order_by(_TOKENS.c.id)).all()
        live = [token_id for token_id, revoked_at in rows if revoked_at is None]
        keep = live[0] if live else rows[-1][0]
        for token_id, revoked_at in rows:
            if token_id == keep:
                continue
            if revoked_at is None:
                log.warning("agent id %r was bound to tokens %s; token %d keeps it, live "
                            "token %d loses it (revoke it if no agent should use it)",
                            agent_id, [r[0] for r in rows], keep, token_id)
            conn.execute(sa.update(_TOKENS).where(_TOKENS.c.id == token_id)
                         .values(agent_id=None))


def upgrade() -> None:
    _resolve_duplicates(op.get_bind())
    op.create_index("uq_api_tokens_agent_id", "api_tokens", ["agent_id"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_api_tokens_agent_id", table_name="api_tokens")
