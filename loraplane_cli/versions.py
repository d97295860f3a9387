"""``versions``, ``promote``, ``rollback`` and ``history``: versions and the aliases on them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

import click

from loraplane.api import AdapterOut, AliasState, VersionOut
from loraplane.naming import DEFAULT_ALIAS
from loraplane_cli.context import CliState, pass_state
from loraplane_cli.output import Output, human_size, short_digest, short_time

VERSION_PAGE = 100
F = TypeVar("F", bound=Callable[..., Any])


def alias_move_line(state: AliasState) -> str:
    """One alias result in words: ``live: 2 -> 3 (revision 4)``."""
    alias, version, revision = state.alias, state.version, state.revision
    previous = state.previous_version
    target = "removed" if version is None else str(version)
    if not state.changed:
        return f"{alias}: unchanged at {target} (revision {revision})"
    return (
        f"{alias}: {previous if previous is not None else 'none'} -> {target} (revision {revision})"
    )


def _aliases_by_version(adapter: AdapterOut) -> dict[int, list[str]]:
    found: dict[int, list[str]] = defaultdict(list)
    for item in adapter.aliases:
        if item.version is not None:
            found[item.version].append(item.alias)
    return found


def _render_versions(
    out: Output, name: str, items: list[VersionOut], aliases: dict[int, list[str]]
) -> None:
    rows = [
        (
            v.version,
            ", ".join(sorted(aliases.get(v.version, []))),
            short_digest(v.digest),
            v.rank,
            v.alpha,
            human_size(v.total_size),
            v.uploader,
            short_time(v.created_at),
            v.notes or None,
        )
        for v in items
    ]
    out.table(
        ("version", "aliases", "digest", "rank", "alpha", "size", "uploader", "created", "notes"),
        rows,
        title=f"{name}: versions, newest first",
        empty=f"{name} has no versions yet: upload one with `loraplane push {name} DIR`",
        whole=("version", "digest", "rank", "alpha", "size", "created"),
        optional=("uploader", "alpha", "rank"),
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
    adapter = client.get_adapter(name)
    items = client.list_versions(name, limit=limit, page_size=min(limit, VERSION_PAGE))
    as_json = {
        "adapter": name,
        "aliases": [a.model_dump(mode="json") for a in adapter.aliases],
        "versions": [v.model_dump(mode="json") for v in items],
    }
    state.output.emit(
        as_json,
        lambda: _render_versions(state.output, name, items, _aliases_by_version(adapter)),
    )


def emit_alias_state(state: CliState, result: AliasState) -> None:
    state.output.emit(
        result,
        lambda: state.output.line(f"{result.adapter} {alias_move_line(result)}", markup=False),
    )


def alias_option(help_text: str = "The alias to move.") -> Callable[[F], F]:
    return click.option("--alias", default=DEFAULT_ALIAS, help=help_text)


expected_option = click.option(
    "--expected-revision",
    "--expect-revision",
    "expected_revision",
    type=click.IntRange(min=0),
    default=None,
    help="Refuse the move unless the alias is still at this revision (optimistic locking).",
)


abort_canary_option = click.option(
    "--abort-canary", is_flag=True,
    help="Abort a canary running on the alias first (else the move is refused).")


@click.command("promote", short_help="Point an alias at a version.")
@click.argument("name")
@click.argument("version", type=click.IntRange(min=1))
@alias_option()
@expected_option
@abort_canary_option
@pass_state
def promote_command(
    state: CliState, name: str, version: int, alias: str, expected_revision: int | None,
    abort_canary: bool,
) -> None:
    """Point an alias of adapter NAME at VERSION (creates the alias if needed)."""
    result = state.client().move_alias(name, alias, version, expected_revision=expected_revision,
                                       abort_canary=abort_canary)
    emit_alias_state(state, result)


@click.command("rollback", short_help="Undo an alias's latest move.")
@click.argument("name")
@alias_option()
@expected_option
@abort_canary_option
@pass_state
def rollback_command(state: CliState, name: str, alias: str, expected_revision: int | None,
                     abort_canary: bool) -> None:
    """Undo the latest move of an alias of adapter NAME that no rollback has undone.

    Repeated rollbacks walk back through the alias's history: after v1, v2, v3 they go
    to v2, then v1, then refuse (no previous version).
    """
    result = state.client().rollback(name, alias, expected_revision=expected_revision,
                                     abort_canary=abort_canary)
    emit_alias_state(state, result)


@click.command("history", short_help="The moves of an alias.")
@click.argument("name")
@alias_option("The alias whose moves to show.")
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=1000),
    default=100,
    help="Show at most this many moves.",
)
@pass_state
def history_command(state: CliState, name: str, alias: str, limit: int) -> None:
    """The moves of an alias of adapter NAME: publish, promote, rollback, delete, and its
    canaries' transitions with their reasons."""
    result = state.client().alias_history(name, alias, limit=limit)
    rows = [
        (m.revision, m.action, m.from_version, m.to_version, m.actor, short_time(m.created_at),
         m.reason)
        for m in result.moves
    ]
    state.output.emit(
        result,
        lambda: state.output.table(
            ("revision", "action", "from", "to", "actor", "at", "reason"),
            rows,
            title=f"{name}@{alias}: alias moves",
            empty=f"{name}@{alias} was never moved",
            whole=("revision", "from", "to", "at"),
            optional=("reason",),
        ),
    )


COMMANDS = (versions_command, promote_command, rollback_command, history_command)
