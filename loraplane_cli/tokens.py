"""``loraplane token``: create, list and revoke API tokens."""

from __future__ import annotations

import click

from loraplane_cli.context import CliState, pass_state
from loraplane_cli.output import short_time

ROLES = ("reader", "publisher", "admin", "agent", "inference")


@click.group("token")
def token_group() -> None:
    """Create, list and revoke API tokens (admin only)."""


@token_group.command("create")
@click.argument("name")
@click.option(
    "--role",
    required=True,
    type=click.Choice(ROLES),
    help="reader < publisher < admin; agent is for inference agents; inference is for "
    "clients of the agents' OpenAI API (one tenant, nothing on the registry).",
)
@click.option("--tenant", default=None, help="Scope the token to one tenant (default: global).")
@click.option("--agent-id", default=None,
              help="Role agent only: the one agent id it may report status for (default: "
              "the first it reports as).")
@pass_state
def create_command(state: CliState, name: str, role: str, tenant: str | None,
                   agent_id: str | None) -> None:
    """Create a token called NAME and print its secret (shown only this once)."""
    created = state.client().create_token(name, role, tenant=tenant, agent_id=agent_id)
    out = state.output

    def render() -> None:
        scope = f"tenant {created.tenant}" if created.tenant else "global"
        out.info(
            f"created token {created.id} ({created.name}, "
            f"{created.role}, {scope}); store the secret now, it is not shown again:"
        )
        # Alone on stdout, so `TOKEN=$(loraplane token create ...)` captures just the secret.
        out.line(created.secret, markup=False)

    out.emit(created, render)


@token_group.command("list")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked tokens.")
@pass_state
def list_command(state: CliState, include_revoked: bool) -> None:
    """List tokens (never their secrets: only the prefix that identifies each)."""
    result = state.client().list_tokens(include_revoked=include_revoked)
    rows = [
        (
            t.id,
            t.name,
            t.role,
            t.tenant or "(global)",
            t.prefix,
            short_time(t.created_at),
            short_time(t.revoked_at) if t.revoked_at else None,
        )
        for t in result.tokens
    ]
    state.output.emit(
        result,
        lambda: state.output.table(
            ("id", "name", "role", "tenant", "prefix", "created", "revoked"),
            rows,
            empty="no tokens",
            whole=("id", "prefix", "created", "revoked"),
            optional=("created",),
        ),
    )


@token_group.command("revoke")
@click.argument("token_id", metavar="ID", type=click.IntRange(min=1))
@pass_state
def revoke_command(state: CliState, token_id: int) -> None:
    """Revoke token ID: it stops working at once."""
    state.client().revoke_token(token_id)
    state.output.emit(
        {"revoked": token_id}, lambda: state.output.line(f"revoked token {token_id}", markup=False)
    )
