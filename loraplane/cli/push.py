"""``loraplane push``: upload a PEFT adapter folder or archive as a new version."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import httpx
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from loraplane.cli.client import CliError, path
from loraplane.cli.context import CliState, pass_state
from loraplane.cli.multipart import FieldPart, FilePart, MultipartBody
from loraplane.cli.output import Output, human_size
from loraplane.cli.versions import alias_move_line
from loraplane.naming import DEFAULT_ALIAS

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
ARCHIVE_TYPES = {
    ".tar.gz": "application/gzip",
    ".tgz": "application/gzip",
    ".tar": "application/x-tar",
    ".zip": "application/zip",
}
# The registry answers only after it has hashed, validated and stored every byte.
UPLOAD_READ_TIMEOUT_S = 600.0


def collect_files(source: Path) -> list[FilePart]:
    """The parts to send for a PEFT folder (its two adapter files) or for one archive."""
    if source.is_dir():
        missing = [n for n in ADAPTER_FILES if not (source / n).is_file()]
        if missing:
            raise CliError(
                f"{source} has no {' or '.join(missing)}",
                code="missing_file",
                hint="a PEFT adapter folder holds adapter_config.json and "
                "adapter_model.safetensors; nothing else in it is uploaded",
                exit_code=2,
            )
        return [FilePart.of("files", source / n) for n in ADAPTER_FILES]
    if source.is_file():
        lowered = source.name.lower()
        for suffix, content_type in ARCHIVE_TYPES.items():
            if lowered.endswith(suffix):
                return [FilePart.of("files", source, content_type=content_type)]
        raise CliError(
            f"{source} is neither an adapter folder nor an archive ({', '.join(ARCHIVE_TYPES)})",
            code="not_an_adapter",
            exit_code=2,
        )
    raise CliError(f"{source} does not exist", code="not_found", exit_code=2)


def parse_alias_options(values: tuple[str, ...], no_alias: bool) -> list[str]:
    """``--alias a --alias b,c`` as ``[a, b, c]`` (each once); the default is ``live``."""
    if no_alias:
        if values:
            raise click.UsageError("--no-alias and --alias cannot be used together")
        return []
    aliases = [a.strip() for value in values for a in value.split(",") if a.strip()]
    return list(dict.fromkeys(aliases)) or [DEFAULT_ALIAS]


def _with_progress(out: Output, body: MultipartBody, label: str) -> Iterator[bytes]:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=out.err, transient=True) as progress:
        task = progress.add_task(f"uploading {label}", total=body.content_length)
        for chunk in body:
            progress.advance(task, len(chunk))
            yield chunk
        progress.update(task, description="the registry is verifying")


def upload(
    state: CliState, name: str, files: list[FilePart], aliases: list[str], notes: str | None
) -> dict[str, Any]:
    client = state.client()
    # Refuse an unknown adapter (or a missing permission) before streaming gigabytes.
    client.get(path("adapters", name))
    fields = [FieldPart("aliases", ",".join(aliases))]
    if notes:
        fields.append(FieldPart("notes", notes))
    body = MultipartBody(fields, files)
    content = _with_progress(state.output, body, name) if state.output.interactive else body
    timeout = httpx.Timeout(state.timeout_s, read=max(state.timeout_s, UPLOAD_READ_TIMEOUT_S))
    result: dict[str, Any] = client.request(
        "POST",
        path("adapters", name, "versions"),
        content=content,
        headers=body.headers,
        timeout=timeout,
    )
    return result


def render_result(out: Output, result: dict[str, Any]) -> None:
    adapter, version = result.get("adapter"), result.get("version")
    if result.get("created"):
        out.line("[green]published[/] " + escape(f"{adapter} version {version} (new)"))
    else:
        out.line(
            f"{adapter} version {version} already holds these files: identical "
            "re-upload, no new version",
            markup=False,
        )
    files = ", ".join(
        f"{f.get('name')} ({human_size(f.get('size'))})" for f in result.get("files") or []
    )
    out.fields(
        [
            ("digest", result.get("digest")),
            ("files", files),
            ("total size", human_size(result.get("total_size"))),
            ("rank / alpha", f"{result.get('rank')} / {result.get('alpha')}"),
            ("target modules", result.get("target_modules")),
            ("base model", result.get("base_model")),
        ]
    )
    moves = result.get("aliases") or []
    if moves:
        out.line("aliases:")
        for move in moves:
            out.line(f"  {alias_move_line(move)}", markup=False)
    else:
        out.line("aliases: none moved")


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
