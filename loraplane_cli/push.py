"""``loraplane push``: upload a PEFT adapter folder or archive as a new version."""

from __future__ import annotations

from dataclasses import dataclass
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
from loraplane.client.multipart import OnProgress
from loraplane.client.multipart import collect_files as source_files
from loraplane.naming import DEFAULT_ALIAS
from loraplane_cli.canary import parse_steps, render_canary
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
    """``--alias a --alias b,c`` as ``[a, b, c]`` (each once); the default is none: storing
    a version does not serve it. ``--no-alias`` says the default out loud."""
    if no_alias and values:
        raise click.UsageError("--no-alias and --alias cannot be used together")
    aliases = [a.strip() for value in values for a in value.split(",") if a.strip()]
    return list(dict.fromkeys(aliases))


def _progress(out: Output) -> Progress:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=out.err, transient=True)


@dataclass(frozen=True, slots=True)
class PushRequest:
    name: str
    files: list[FilePart]
    aliases: list[str]
    notes: str | None
    allow_shape_change: bool


def upload(state: CliState, request: PushRequest) -> UploadResult:
    client = state.client()
    name = request.name

    def push(on_progress: OnProgress | None = None) -> UploadResult:
        return client.push(name, request.files, aliases=request.aliases, notes=request.notes,
                           allow_shape_change=request.allow_shape_change,
                           on_progress=on_progress)

    if not state.output.interactive:
        return push()
    with _progress(state.output) as progress:
        task = progress.add_task(f"uploading {name}", total=None)

        def on_progress(sent: int, total: int) -> None:
            progress.update(task, completed=sent, total=total)
            if sent == total:
                progress.update(task, description="the registry is verifying")

        return push(on_progress)


def render_result(out: Output, result: UploadResult) -> None:
    # Warnings first: read before the summary, not scrolled past under it.
    for warning in result.warnings:
        out.warn(warning)
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
    for check in result.checks:
        out.line(f"checked: {check}", markup=False)
    _render_aliases(out, result)


def _render_aliases(out: Output, result: UploadResult) -> None:
    """The aliases moved; when none was, how to serve a new version."""
    adapter, version = result.adapter, result.version
    if result.aliases:
        out.line("aliases:")
        for move in result.aliases:
            out.line(f"  {alias_move_line(move)}", markup=False)
    elif not result.created:
        # An existing version may be served already: its aliases are not in this answer.
        out.line(f"aliases: none moved (`loraplane versions {adapter}` shows them)",
                 markup=False)
    else:
        out.line("aliases: none moved (not served yet)")
        out.line(f"serve it: loraplane promote {adapter} {version} --alias {DEFAULT_ALIAS}",
                 markup=False)


@click.command("push", short_help="Upload a PEFT adapter as a new version.")
@click.argument("name")
@click.argument("source", metavar="DIR_OR_ARCHIVE", type=click.Path(path_type=Path, exists=True))
@click.option(
    "--alias",
    "aliases",
    multiple=True,
    help="Alias to point at the new version (e.g. live); repeat it or give a comma list. "
         "[default: none, the version is stored but not served]",
)
@click.option("--no-alias", is_flag=True, help="Move no alias (the default).")
@click.option("--allow-shape-change", is_flag=True,
              help="Accept tensor shapes unlike the adapter's current versions' "
                   "(a new base model).")
@click.option("--notes", default=None, help="Free-text notes stored with the version.")
@click.option("--canary", "canary_steps", default=None, metavar="STEPS",
              help="Then start a canary of the new version on --canary-alias, through these "
                   "weights in percent (e.g. 10, or 10,50), with the default analysis.")
@click.option("--canary-alias", default=DEFAULT_ALIAS, show_default=True,
              help="The alias --canary runs on.")
@pass_state
def push_command(
    state: CliState,
    /,
    *,
    name: str,
    source: Path,
    aliases: tuple[str, ...],
    no_alias: bool,
    allow_shape_change: bool,
    notes: str | None,
    canary_steps: str | None,
    canary_alias: str,
) -> None:
    """Upload a PEFT adapter (a folder, or one .tar.gz/.tgz/.tar/.zip) as a version of NAME.

    No alias moves unless --alias names it: `loraplane promote NAME VERSION` serves the
    version later. A version whose tensor shapes differ from the adapter's current
    versions' is refused unless --allow-shape-change. Uploading the same files again is
    not a new version: the existing one is reported and its aliases are moved as asked.
    With --canary, the version then earns the alias's traffic step by step
    (`loraplane canary status NAME` follows it).
    """
    moved = parse_alias_options(aliases, no_alias)
    steps = None if canary_steps is None else parse_steps(canary_steps)
    if steps is not None and canary_alias in moved:
        raise click.UsageError(f"--canary runs on {canary_alias!r}: do not also move it "
                               "with --alias")
    request = PushRequest(name, collect_files(source), moved, notes, allow_shape_change)
    result = upload(state, request)
    if steps is None:
        state.output.emit(result, lambda: render_result(state.output, result))
        return
    canary = state.client().start_canary(name, result.version, alias=canary_alias,
                                         steps=steps)

    def render() -> None:
        render_result(state.output, result)
        render_canary(state.output, canary)

    state.output.emit({"upload": result.model_dump(mode="json"),
                       "canary": canary.model_dump(mode="json")}, render)
