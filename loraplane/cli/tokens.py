"""``loraplane token``: create, list and revoke API tokens."""

from __future__ import annotations

from typing import Any

import click

from loraplane.cli.client import CliError, path
from loraplane.cli.context import CliState, pass_state
from loraplane.cli.output import short_time

ROLES = ("reader", "publisher", "admin", "agent")


@click.group("token")
def token_group() -> None:
    """Create, list and revoke API tokens (admin only)."""


@token_group.command("create")
@click.argument("name")
@click.option(
    "--role",
    required=True,
    type=click.Choice(ROLES),
    help="reader < publisher < admin; agent is for inference agents.",
)
@click.option("--tenant", default=None, help="Scope the token to one tenant (default: global).")
@pass_state
def create_command(state: CliState, name: str, role: str, tenant: str | None) -> None:
    """Create a token called NAME and print its secret (shown only this once)."""
    body: dict[str, Any] = {"name": name, "role": role}
    if tenant is not None:
        body["tenant"] = tenant
    created = state.client().post(path("tokens"), body)
    secret = created.get("secret")
    if not isinstance(secret, str):
        raise CliError("the registry created the token but sent no secret", code="bad_response")
    out = state.output

    def render() -> None:
        scope = f"tenant {created.get('tenant')}" if created.get("tenant") else "global"
        out.info(
            f"created token {created.get('id')} ({created.get('name')}, "
            f"{created.get('role')}, {scope}); store the secret now, it is not shown again:"
        )
        # Alone on stdout, so `TOKEN=$(loraplane token create ...)` captures just the secret.
        out.line(secret, markup=False)

    out.emit(created, render)


@token_group.command("list")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked tokens.")
@pass_state
def list_command(state: CliState, include_revoked: bool) -> None:
    """List tokens (never their secrets: only the prefix that identifies each)."""
    result = state.client().get(
        path("tokens"), {"include_revoked": "true" if include_revoked else None}
    )
    tokens = result.get("tokens") or []
    rows = [
        (
            t.get("id"),
            t.get("name"),
            t.get("role"),
            t.get("tenant") or "(global)",
            t.get("prefix"),
            short_time(t.get("created_at")),
            short_time(t.get("revoked_at")) if t.get("revoked_at") else None,
        )
        for t in tokens
    ]
    state.output.emit(
        result,
        lambda: state.output.table(
            ("id", "name", "role", "tenant", "prefix", "created", "revoked"),
            rows,
            empty="no tokens",
        ),
    )


@token_group.command("revoke")
@click.argument("token_id", metavar="ID", type=click.IntRange(min=1))
@pass_state
def revoke_command(state: CliState, token_id: int) -> None:
    """Revoke token ID: it stops working at once."""
    state.client().delete(path("tokens", token_id))
    state.output.emit(
        {"revoked": token_id}, lambda: state.output.line(f"revoked token {token_id}", markup=False)
    )
