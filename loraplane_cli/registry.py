"""``loraplane registry serve`` and ``loraplane registry migrate``.

Both build a ``RegistrySettings``: flags given on the command line win, and everything
else comes from ``LORAPLANE_<FIELD>`` as the registry reads it anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from loraplane.nats_flags import nats_options
from loraplane_cli.client import CliError
from loraplane_cli.context import CliState, pass_state
from registry_service.settings import DEFAULT_DATA_DIR, RegistrySettings

LOG_LEVELS = ("debug", "info", "warning", "error")
EXIT_BAD_SETTINGS = 2
EXIT_STARTUP_FAILED = 3


@click.group("registry")
def registry_group() -> None:
    """Run the registry service, or migrate its database."""


def describe_validation(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"])
        # Never echo the input: it may be a secret (S3 keys, the admin token).
        where = f"{field} (LORAPLANE_{field.upper()}): " if field else ""
        lines.append(f"  {where}{error['msg']}")
    return "invalid registry settings:\n" + "\n".join(lines)


def admin_token_note(data_dir: Path, token_file: Path) -> str:
    """How a CLI finds the embedded registry's admin token: by itself only in the
    default data dir."""
    elsewhere = f"elsewhere: export LORAPLANE_TOKEN=$(cat {token_file})"
    if data_dir.expanduser().resolve() == DEFAULT_DATA_DIR.resolve():
        return f"the CLI on this machine reads the admin token from that file; {elsewhere}"
    return (f"the CLI on this machine reads that admin token with --data-dir {data_dir} "
            f"(or LORAPLANE_DATA_DIR={data_dir}), or save it once with "
            f"`loraplane login < {token_file}`; {elsewhere}")


def load_settings(state: CliState, overrides: dict[str, Any]) -> RegistrySettings:
    """Flags that were given, over ``LORAPLANE_*``; exit 2 with every problem listed."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if "data_dir" not in given and state.data_dir is not None:
        given["data_dir"] = state.data_dir
    try:
        return RegistrySettings(**given)
    except ValidationError as exc:
        raise CliError(
            describe_validation(exc), code="invalid_settings", exit_code=EXIT_BAD_SETTINGS
        ) from exc


def database_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--data-dir`` and ``--database-url``: where the registry keeps its state."""
    data_dir = click.option(
        "--data-dir",
        type=click.Path(path_type=Path, file_okay=False),
        default=None,
        help="Data dir: SQLite database, local blobs, NATS store, admin token.",
    )
    database_url = click.option(
        "--database-url",
        default=None,
        help="postgresql:// or sqlite:// URL. [default: SQLite in the data dir]",
    )
    return data_dir(database_url(command))


def _name_paths(values: tuple[str, ...]) -> dict[str, str] | None:
    """``NAME=PATH`` pairs as a dict; None (the environment decides) when none are given."""
    pairs: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not (sep and name and path):
            raise click.BadParameter(f"{value!r} is not NAME=PATH")
        pairs[name] = path
    return pairs or None


@registry_group.command("serve")
@click.option("--host", default=None, help="Interface to listen on. [default: 127.0.0.1]")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="TCP port to listen on. [default: 8080]",
)
@database_options
@click.option("--s3-endpoint", default=None, help="S3 endpoint URL (MinIO, SeaweedFS, ...).")
@click.option(
    "--s3-public-endpoint",
    default=None,
    help="S3 endpoint URL that agents reach, named in presigned download URLs. "
    "[default: --s3-endpoint]",
)
@click.option(
    "--s3-bucket", default=None, help="S3 bucket for blobs. [default: local blobs in the data dir]"
)
@click.option(
    "--nats-url", default=None, help="NATS JetStream URL. [default: an embedded nats-server]"
)
@click.option(
    "--base-model-config",
    "base_model_configs",
    multiple=True,
    metavar="NAME=PATH",
    callback=lambda _ctx, _param, values: _name_paths(values),
    help="The HF config.json (or its folder) of base model NAME; uploads for it are then "
    "judged by tensor shapes. Repeatable.",
)
@click.option("--prometheus-url", default=None,
              help="A Prometheus scraping the agents: canary analyses read their metrics "
              "there. [default: the agents' reports]")
@nats_options
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default=None, help="[default: info]")
@pass_state
def serve_command(state: CliState, /, **options: Any) -> None:
    """Run the registry. With no configuration it runs the embedded default:
    SQLite, local blobs and an embedded NATS, all under the data dir.

    Every setting can also be given as LORAPLANE_<SETTING> (LORAPLANE_DATABASE_URL, ...).
    """
    from registry_service.memory import import_nats_without_websockets  # noqa: PLC0415

    settings = load_settings(state, options)
    import_nats_without_websockets(settings.nats_url)
    # Imports the whole registry (seconds); only the two server commands pay for it.
    from registry_service import server  # noqa: PLC0415

    setup: dict[str, str] = server.describe_setup(settings)
    out = state.output

    def render() -> None:
        out.fields([(k.replace("_", " "), v) for k, v in setup.items()])
        if settings.admin_token is None and settings.database_url is None:
            out.line(admin_token_note(settings.data_dir, settings.admin_token_file),
                     markup=False)

    out.emit(setup, render)
    try:
        server.run_server(settings)
    except server.StartupFailed as exc:
        raise CliError(exc.message, code=exc.code, exit_code=EXIT_STARTUP_FAILED) from None


@registry_group.command("migrate")
@click.option("--revision", default=None, help="Upgrade to this revision. [default: head]")
@click.option(
    "--downgrade",
    "downgrade_to",
    default=None,
    metavar="REV",
    help="Downgrade to REV instead (e.g. base, or a revision id).",
)
@database_options
@pass_state
def migrate_command(
    state: CliState,
    /,
    *,
    revision: str | None,
    downgrade_to: str | None,
    data_dir: Path | None,
    database_url: str | None,
) -> None:
    """Upgrade (or downgrade) the registry's database schema."""
    from registry_service import server  # noqa: PLC0415 - heavy, see serve_command
    from registry_service.db.migrate import MigrationFailed, migrate_database  # noqa: PLC0415

    if revision is not None and downgrade_to is not None:
        raise click.UsageError("give --revision or --downgrade, not both")
    settings = load_settings(state, {"data_dir": data_dir, "database_url": database_url})
    target = downgrade_to if downgrade_to is not None else revision or "head"
    try:
        before, after = migrate_database(settings, target, down=downgrade_to is not None)
    except MigrationFailed as exc:
        raise CliError(exc.message, code=exc.code) from exc
    where = server.safe_database_url(settings)
    result = {"database": where, "from": before, "to": after, "changed": before != after}

    def render() -> None:
        if before == after:
            state.output.line(f"{where}: already at {after or 'base'}", markup=False)
        else:
            state.output.line(f"{where}: {before or 'base'} -> {after or 'base'}", markup=False)

    state.output.emit(result, render)
