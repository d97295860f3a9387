"""``loraplane push``: upload a PEFT adapter folder or archive as a new version."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from loraplane.api import UploadResult
from loraplane.client import FilePart, InvalidSource
from loraplane.client.multipart import collect_files as source_files
from loraplane.naming import DEFAULT_ALIAS
from loraplane_cli.client import cli_error
from loraplane_cli.context import CliState, pass_state
from loraplane_cli.output import Output, human_size
from loraplane_cli.versions import alias_move_line


def collect_files(source: Path) -> list[FilePart]:
    """The parts to send for a PEFT folder (its two adapter files) or for one archive."""
    try:
        return source_files(source)
    except InvalidSource as exc:
        raise cli_error(exc, has_token=False) from exc


def parse_alias_options(values: tuple[str, ...], no_alias: bool) -> list[str]:
    """``--alias a --alias b,c`` as ``[a, b, c]`` (each once); the default is ``live``."""
    if no_alias:
        if values:
            raise click.UsageError("--no-alias and --alias cannot be used together")
        return []
    aliases = [a.strip() for value in values for a in value.split(",") if a.strip()]
    return list(dict.fromkeys(aliases)) or [DEFAULT_ALIAS]


def _progress(out: Output) -> Progress:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=out.err, transient=True)


def upload(
    state: CliState, name: str, files: list[FilePart], aliases: list[str], notes: str | None
) -> UploadResult:
    client = state.client()
    if not state.output.interactive:
        return client.push(name, files, aliases=aliases, notes=notes)
    with _progress(state.output) as progress:
        task = progress.add_task(f"uploading {name}", total=None)

        def on_progress(sent: int, total: int) -> None:
            progress.update(task, completed=sent, total=total)
            if sent == total:
                progress.update(task, description="the registry is verifying")

        return client.push(name, files, aliases=aliases, notes=notes, on_progress=on_progress)


def render_result(out: Output, result: UploadResult) -> None:
    adapter, version = result.adapter, result.version
    if result.created:
        out.line("[green]published[/] " + escape(f"{adapter} version {version} (new)"))
    else:
        out.line(
            f"{adapter} version {version} already holds these files: identical "
            "re-upload, no new version",
            markup=False,
        )
    files = ", ".join(f"{f.name} ({human_size(f.size)})" for f in result.files)
    out.fields(
        [
            ("digest", result.digest),
            ("files", files),
            ("total size", human_size(result.total_size)),
            ("rank / alpha", f"{result.rank} / {result.alpha}"),
            ("target modules", result.target_modules),
            ("base model", result.base_model),
        ]
    )
    if result.aliases:
        out.line("aliases:")
        for move in result.aliases:
            out.line(f"  {alias_move_line(move)}", markup=False)
    else:
        out.line("aliases: none moved")
    for warning in result.warnings:
        out.warn(warning)


@click.command("push", short_help="Upload a PEFT adapter as a new version.")
@click.argument("name")
@click.argument("source", metavar="DIR_OR_ARCHIVE", type=click.Path(path_type=Path, exists=True))
@click.option(
    "--alias",
    "aliases",
    multiple=True,
    help="Alias to point at the new version; repeat it or give a comma list. [default: live]",
)
@click.option("--no-alias", is_flag=True, help="Publish without moving any alias.")
@click.option("--notes", default=None, help="Free-text notes stored with the version.")
@pass_state
def push_command(
    state: CliState,
    /,
    *,
    name: str,
    source: Path,
    aliases: tuple[str, ...],
    no_alias: bool,
    notes: str | None,
) -> None:
    """Upload a PEFT adapter (a folder, or one .tar.gz/.tgz/.tar/.zip) as a version of NAME.

    Uploading the same files again is not a new version: the existing one is reported
    and its aliases are moved as asked.
    """
    alias_list = parse_alias_options(aliases, no_alias)
    result = upload(state, name, collect_files(source), alias_list, notes)
    state.output.emit(result, lambda: render_result(state.output, result))
