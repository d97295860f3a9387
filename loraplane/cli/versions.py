"""``versions``, ``promote``, ``rollback`` and ``history``: versions and the aliases on them."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import click

from loraplane.cli.client import path
from loraplane.cli.context import CliState, pass_state
from loraplane.cli.output import Output, human_size, short_digest, short_time
from loraplane.naming import DEFAULT_ALIAS

VERSION_PAGE = 100


def alias_move_line(state: dict[str, Any]) -> str:
    """One alias result in words: ``live: 2 -> 3 (revision 4)``."""
    alias, version, revision = state.get("alias"), state.get("version"), state.get("revision")
    previous = state.get("previous_version")
    target = "removed" if version is None else str(version)
    if not state.get("changed", True):
        return f"{alias}: unchanged at {target} (revision {revision})"
    return (
        f"{alias}: {previous if previous is not None else 'none'} -> {target} (revision {revision})"
    )


def _aliases_by_version(adapter: dict[str, Any]) -> dict[int, list[str]]:
    found: dict[int, list[str]] = defaultdict(list)
    for item in adapter.get("aliases") or []:
        if item.get("version") is not None:
            found[int(item["version"])].append(str(item["alias"]))
    return found


def _render_versions(
    out: Output, name: str, items: list[dict[str, Any]], aliases: dict[int, list[str]]
) -> None:
    rows = [
        (
            v.get("version"),
            ", ".join(sorted(aliases.get(int(v.get("version", 0)), []))),
            short_digest(v.get("digest")),
            v.get("rank"),
            v.get("alpha"),
            human_size(v.get("total_size")),
            v.get("uploader"),
            short_time(v.get("created_at")),
            v.get("notes") or None,
        )
        for v in items
    ]
    out.table(
        ("version", "aliases", "digest", "rank", "alpha", "size", "uploader", "created", "notes"),
        rows,
        title=f"{name}: versions, newest first",
        empty=f"{name} has no versions yet: upload one with `loraplane push {name} DIR`",
    )


@click.command("versions", short_help="List the versions of an adapter.")
@click.argument("name")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=50,
    help="Show at most this many versions (newest first).",
)
@pass_state
def versions_command(state: CliState, name: str, limit: int) -> None:
    """List the versions of adapter NAME, newest first, with the aliases on them."""
    client = state.client()
    adapter = client.get(path("adapters", name))
    items = client.paginate(
        path("adapters", name, "versions"),
        "versions",
        limit=limit,
        page_size=min(limit, VERSION_PAGE),
    )
    state.output.emit(
        {"adapter": name, "aliases": adapter.get("aliases") or [], "versions": items},
        lambda: _render_versions(state.output, name, items, _aliases_by_version(adapter)),
    )


def _emit_alias_state(state: CliState, result: dict[str, Any]) -> None:
    state.output.emit(
        result,
        lambda: state.output.line(
            f"{result.get('adapter')} {alias_move_line(result)}", markup=False
        ),
    )


alias_option = click.option("--alias", default=DEFAULT_ALIAS, help="The alias to move.")
expected_option = click.option(
    "--expected-revision",
    type=click.IntRange(min=0),
    default=None,
    help="Refuse the move unless the alias is still at this revision (optimistic locking).",
)


@click.command("promote", short_help="Point an alias at a version.")
@click.argument("name")
@click.argument("version", type=click.IntRange(min=1))
@alias_option
@expected_option
@pass_state
def promote_command(
    state: CliState, name: str, version: int, alias: str, expected_revision: int | None
) -> None:
    """Point an alias of adapter NAME at VERSION (creates the alias if needed)."""
    body: dict[str, Any] = {"version": version}
    if expected_revision is not None:
        body["expected_revision"] = expected_revision
    _emit_alias_state(state, state.client().put(path("adapters", name, "aliases", alias), body))


@click.command("rollback", short_help="Move an alias back to its previous version.")
@click.argument("name")
@alias_option
@expected_option
@pass_state
def rollback_command(state: CliState, name: str, alias: str, expected_revision: int | None) -> None:
    """Move an alias of adapter NAME back to the version it pointed at before."""
    body = None if expected_revision is None else {"expected_revision": expected_revision}
    result = state.client().request(
        "POST", path("adapters", name, "aliases", alias, "rollback"), json=body
    )
    _emit_alias_state(state, result)


@click.command("history", short_help="The moves of an alias.")
@click.argument("name")
@alias_option
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=1000),
    default=100,
    help="Show at most this many moves.",
)
@pass_state
def history_command(state: CliState, name: str, alias: str, limit: int) -> None:
    """The moves of an alias of adapter NAME: publish, promote, rollback, delete."""
    result = state.client().get(
        path("adapters", name, "aliases", alias, "history"), {"limit": limit}
    )
    moves = result.get("moves") or []
    rows = [
        (
            m.get("revision"),
            m.get("action"),
            m.get("from_version"),
            m.get("to_version"),
            m.get("actor"),
            short_time(m.get("created_at")),
        )
        for m in moves
    ]
    state.output.emit(
        result,
        lambda: state.output.table(
            ("revision", "action", "from", "to", "actor", "at"),
            rows,
            title=f"{name}@{alias}: alias moves",
            empty=f"{name}@{alias} was never moved",
        ),
    )


COMMANDS = (versions_command, promote_command, rollback_command, history_command)
