"""``loraplane adapters``: create, list, show, place and delete adapters."""

from __future__ import annotations

import click
from rich.markup import escape

from loraplane.api import AdapterOut
from loraplane_cli.client import CliError
from loraplane_cli.context import CliState, pass_state
from loraplane_cli.output import Output, short_time

ADAPTER_PAGE = 200


@click.group("adapters")
def adapters_group() -> None:
    """Create, list, show and delete adapters."""


def alias_summary(adapter: AdapterOut) -> str:
    """``live→2, canary→3``: where each alias of the adapter points."""
    return ", ".join(f"{a.alias}→{a.version}" for a in adapter.aliases) or "-"


def render_adapter(out: Output, adapter: AdapterOut) -> None:
    out.fields(
        [
            ("name", adapter.name),
            ("tenant", adapter.tenant),
            ("base model", adapter.base_model),
            ("description", adapter.description or None),
            ("latest version", adapter.latest_version),
            ("replicas", adapter.replicas if adapter.replicas is not None else "all (on demand)"),
            ("created", short_time(adapter.created_at)),
        ]
    )
    rows = [
        (a.alias, a.version, a.revision, short_time(a.updated_at)) for a in adapter.aliases
    ]
    out.line()
    out.table(
        ("alias", "version", "revision", "updated"), rows, title="aliases", empty="no aliases yet"
    )


@adapters_group.command("create")
@click.argument("name")
@click.option("--base-model", required=True, help="The base model the adapter is trained on.")
@click.option("--tenant", default=None, help="Owning tenant (default: the token's tenant).")
@click.option("--description", default=None, help="Free text describing the adapter.")
@click.option("--replicas", type=int, default=None,
              help="How many agents keep it hot (default: none; loaded on demand).")
@pass_state
def create_command(
    state: CliState, name: str, base_model: str, tenant: str | None, description: str | None,
    replicas: int | None,
) -> None:
    """Create adapter NAME (a lowercase slug) for a base model."""
    adapter = state.client().create_adapter(
        name, base_model, tenant=tenant, description=description, replicas=replicas
    )

    def render() -> None:
        state.output.line(
            "[green]created[/] "
            + escape(
                f"adapter {adapter.name} (tenant {adapter.tenant}, "
                f"base model {adapter.base_model})"
            )
        )

    state.output.emit(adapter, render)


@adapters_group.command("list")
@click.option("--tenant", default=None, help="Only adapters of this tenant.")
@click.option("--base-model", default=None, help="Only adapters of this base model.")
@pass_state
def list_command(state: CliState, tenant: str | None, base_model: str | None) -> None:
    """List adapters (every page)."""
    items = state.client().list_adapters(
        tenant=tenant, base_model=base_model, page_size=ADAPTER_PAGE
    )

    def render() -> None:
        # The day alone: with the aliases column the table still fits 80 columns.
        rows = [
            (a.name, a.tenant, a.base_model, a.latest_version, alias_summary(a),
             short_time(a.created_at)[:10])
            for a in items
        ]
        state.output.table(
            ("name", "tenant", "base model", "latest", "aliases", "created"), rows,
            empty="no adapters",
        )

    state.output.emit({"adapters": [a.model_dump(mode="json") for a in items]}, render)


@adapters_group.command("show")
@click.argument("name")
@pass_state
def show_command(state: CliState, name: str) -> None:
    """Show adapter NAME and its aliases."""
    adapter = state.client().get_adapter(name)
    state.output.emit(adapter, lambda: render_adapter(state.output, adapter))


@adapters_group.command("place")
@click.argument("name")
@click.option("--replicas", type=int, default=None, help="How many agents keep it hot.")
@click.option("--clear", is_flag=True, help="No placement: every agent loads it on demand.")
@pass_state
def place_command(state: CliState, name: str, replicas: int | None, clear: bool) -> None:
    """Set how many agents keep adapter NAME hot (rendezvous placement)."""
    if (replicas is None) == (not clear):
        raise CliError("give either --replicas N or --clear", code="usage", exit_code=2)
    adapter = state.client().set_placement(name, None if clear else replicas)
    placed = adapter.replicas if adapter.replicas is not None else "no placement"
    state.output.emit(
        adapter, lambda: state.output.line(f"adapter {name}: replicas {placed}", markup=False)
    )


@adapters_group.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Confirm: the adapter and its aliases are removed.")
@pass_state
def delete_command(state: CliState, name: str, yes: bool) -> None:
    """Delete adapter NAME; agents unload it. Needs --yes."""
    if not yes:
        raise CliError(
            f"deleting {name} removes it and its aliases from every agent; add --yes to confirm",
            code="confirmation_required",
            exit_code=2,
        )
    state.client().delete_adapter(name)
    state.output.emit(
        {"deleted": name}, lambda: state.output.line(f"deleted adapter {name}", markup=False)
    )
