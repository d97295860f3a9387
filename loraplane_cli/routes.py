"""``loraplane route``: the routing rules of a tenant; ``loraplane alias``: aliases."""

from __future__ import annotations

from typing import cast, get_args

import click

from loraplane.api import RouteOut
from loraplane.events import DEFAULT_ROUTE_KEY, RouteKind
from loraplane.naming import DEFAULT_ALIAS
from loraplane_cli.client import CliError
from loraplane_cli.context import CliState, pass_state
from loraplane_cli.output import short_time
from loraplane_cli.versions import emit_alias_state, expected_option

KINDS = get_args(RouteKind)

tenant_option = click.option(
    "--tenant",
    default=None,
    help="The tenant whose rules these are. A tenant token means its own (and may name "
    "no other); a global token names one when the key alone is ambiguous.",
)
kind_argument = click.argument("kind", type=click.Choice(KINDS))
key_argument = click.argument("key", required=False)


def _key(kind: str, key: str | None) -> str:
    """'default' has one key, so it may be left out; the other kinds need one."""
    if key is not None:
        return key
    if kind == "default":
        return DEFAULT_ROUTE_KEY
    raise CliError(f"a {kind} rule needs a KEY: the value of the request's {kind} header",
                   code="missing_route_key", exit_code=2)


def _rule_line(rule: RouteOut) -> str:
    return (f"{rule.kind}/{rule.key} -> {rule.adapter}@{rule.alias} "
            f"(tenant {rule.tenant}, base model {rule.base_model})")


@click.group("route")
def route_group() -> None:
    """Route requests by customer, task or a tenant's default to an adapter's alias.

    A request to an agent names a customer or a task in a header; the rules of its
    tenant map that key to ADAPTER@ALIAS, and the tenant's 'default' rule catches
    the rest.
    """


@route_group.command("set")
@kind_argument
@key_argument
@click.option("--adapter", required=True, help="The adapter the requests go to.")
@click.option("--alias", default=DEFAULT_ALIAS, help="The adapter's alias (must point at a "
              "version).")
@tenant_option
@pass_state
def set_command(state: CliState, kind: str, key: str | None, adapter: str, alias: str,
                tenant: str | None) -> None:
    """Create or replace the rule KIND/KEY of the adapter's tenant.

    KIND is customer, task or default; a 'default' rule's KEY is 'default' and may
    be left out.
    """
    rule = state.client().put_route(cast(RouteKind, kind), _key(kind, key), adapter,
                                    alias=alias, tenant=tenant)
    state.output.emit(rule, lambda: state.output.line(f"set {_rule_line(rule)}", markup=False))


@route_group.command("delete")
@kind_argument
@key_argument
@tenant_option
@pass_state
def delete_command(state: CliState, kind: str, key: str | None, tenant: str | None) -> None:
    """Delete the rule KIND/KEY (a 'default' rule's KEY may be left out)."""
    rule_key = _key(kind, key)
    state.client().delete_route(cast(RouteKind, kind), rule_key, tenant=tenant)
    state.output.emit({"deleted": {"kind": kind, "key": rule_key, "tenant": tenant}},
                      lambda: state.output.line(f"deleted {kind}/{rule_key}", markup=False))


@route_group.command("list")
@click.option("--kind", type=click.Choice(KINDS), default=None, help="Only rules of this kind.")
@tenant_option
@pass_state
def list_command(state: CliState, kind: str | None, tenant: str | None) -> None:
    """List the routing rules: a tenant token's own, or with a global token every
    tenant's (or those of --tenant)."""
    result = state.client().list_routes(kind=cast(RouteKind | None, kind), tenant=tenant)
    rows = [(r.tenant, r.kind, r.key, f"{r.adapter}@{r.alias}", r.base_model,
             short_time(r.updated_at)) for r in result.routes]
    state.output.emit(
        result,
        lambda: state.output.table(
            ("tenant", "kind", "key", "target", "base model", "updated"), rows,
            title="routing rules",
            empty="no routing rules: add one with `loraplane route set KIND KEY --adapter NAME`",
            whole=("kind", "updated"), optional=("updated", "base model"),
        ),
    )


@click.group("alias")
def alias_group() -> None:
    """List, set and delete the aliases of an adapter.

    An alias (live, canary, ...) names one version; agents serve NAME@ALIAS. `promote`
    and `rollback` move one as well, `history` shows its moves.
    """


@alias_group.command("list")
@click.argument("name")
@pass_state
def alias_list_command(state: CliState, name: str) -> None:
    """List the aliases of adapter NAME and the version each points at."""
    adapter = state.client().get_adapter(name)
    rows = [(a.alias, a.version, a.revision, short_time(a.updated_at)) for a in adapter.aliases]
    state.output.emit(
        {"adapter": name, "aliases": [a.model_dump(mode="json") for a in adapter.aliases]},
        lambda: state.output.table(
            ("alias", "version", "revision", "moved at"), rows,
            title=f"{name}: aliases",
            empty=f"{name} has no aliases: set one with `loraplane alias set {name} ALIAS N`",
            whole=("version", "revision", "moved at")),
    )


@alias_group.command("set")
@click.argument("name")
@click.argument("alias")
@click.argument("version", type=click.IntRange(min=1))
@expected_option
@pass_state
def alias_set_command(state: CliState, name: str, alias: str, version: int,
                      expected_revision: int | None) -> None:
    """Point ALIAS of adapter NAME at VERSION (creates the alias if needed)."""
    emit_alias_state(state, state.client().move_alias(
        name, alias, version, expected_revision=expected_revision))


@alias_group.command("delete")
@click.argument("name")
@click.argument("alias")
@pass_state
def alias_delete_command(state: CliState, name: str, alias: str) -> None:
    """Delete ALIAS of adapter NAME: agents stop serving NAME@ALIAS."""
    emit_alias_state(state, state.client().delete_alias(name, alias))
