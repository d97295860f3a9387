"""``loraplane``: the command line: the registry's client, and the launcher of both services.

Global options come before the command (``loraplane --registry URL versions NAME``);
``--json`` may also come after it (``loraplane versions NAME --json``). Every option
can also be set as ``LORAPLANE_<OPTION>``; options of a subcommand are also read from
``LORAPLANE_<COMMAND>_<OPTION>`` (click's auto_envvar_prefix).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from inference_agent.command import INHERITED_SETTINGS, AgentStartError, agent_command
from loraplane import __version__
from loraplane.client import RegistryError
from loraplane_cli import (
    account,
    adapters,
    canary,
    completion,
    events,
    fleet,
    push,
    registry,
    routes,
    tokens,
    versions,
)
from loraplane_cli.client import DEFAULT_REGISTRY, DEFAULT_TIMEOUT_S, CliError, cli_error
from loraplane_cli.context import CliState
from loraplane_cli.output import Output

DEBUG_ENV = "LORAPLANE_DEBUG"


def _json_after_command(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    state = ctx.find_object(CliState)
    if value and state is not None:
        state.output.json_mode = True


def _add_output_flags(command: click.Command) -> None:
    """Give ``command`` (and every command under it) its own ``--json``, which switches
    on the same output as the root's: scripts put it wherever they like."""
    if not any("--json" in param.opts for param in command.params):
        command.params.append(click.Option(
            ["--json"], is_flag=True, expose_value=False, is_eager=True,
            allow_from_autoenv=False, callback=_json_after_command,
            help="Print results as JSON for scripts (also before the command)."))
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_output_flags(sub)


class LoraplaneGroup(click.Group):
    """The root group: turns every expected failure into one message and an exit code,
    and lets every command below it take the root's output flags."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        _add_output_flags(cmd)
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RegistryError as exc:
            state = ctx.find_object(CliState)
            error = cli_error(exc, has_token=state is not None and state.has_token,
                              missing_token_file=state.missing_token_file if state else None)
            _output(ctx).error(error)
            raise click.exceptions.Exit(error.exit_code) from None
        except CliError as exc:
            _output(ctx).error(exc)
            raise click.exceptions.Exit(exc.exit_code) from None
        except AgentStartError as exc:
            _output(ctx).error(CliError(exc.message, code=exc.code, exit_code=exc.exit_code))
            raise click.exceptions.Exit(exc.exit_code) from None
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as exc:
            # A bug, not a user error: say so briefly, and keep the stack for whoever debugs.
            if os.environ.get(DEBUG_ENV):
                raise
            _output(ctx).error(
                CliError(
                    f"unexpected {type(exc).__name__}: {exc}",
                    code="internal_error",
                    hint=f"set {DEBUG_ENV}=1 to see the traceback",
                )
            )
            raise click.exceptions.Exit(1) from None


def _output(ctx: click.Context) -> Output:
    state = ctx.find_object(CliState)
    return state.output if state is not None else Output()


@click.group(
    cls=LoraplaneGroup,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
@click.option(
    "--registry",
    "registry_url",
    envvar="LORAPLANE_REGISTRY",
    default=None,
    show_envvar=True,
    metavar="URL",
    help=f"Base URL of the registry. [default: the profile's, else {DEFAULT_REGISTRY}]",
)
@click.option(
    "--profile",
    envvar="LORAPLANE_PROFILE",
    show_envvar=True,
    default=None,
    help="The profile of the config file (`loraplane login`) to use. [default: default]",
)
@click.option(
    "--token",
    envvar="LORAPLANE_TOKEN",
    show_envvar=True,
    default=None,
    show_default=False,
    help="Bearer token. Without one: the profile's (`loraplane login`), else the admin "
    "token file of the data dir when the registry runs on this machine.",
)
@click.option(
    "--data-dir",
    envvar="LORAPLANE_DATA_DIR",
    show_envvar=True,
    default=None,
    type=click.Path(path_type=Path, file_okay=False),
    show_default=False,
    help="Data dir of the embedded registry (for its admin-token file). [default: ~/.loraplane]",
)
@click.option(
    "--timeout",
    "timeout_s",
    envvar="LORAPLANE_TIMEOUT",
    show_envvar=True,
    type=click.FloatRange(min=0.1),
    default=DEFAULT_TIMEOUT_S,
    help="Seconds to wait for the registry.",
)
@click.option(
    "--json",
    "json_mode",
    envvar="LORAPLANE_JSON",
    show_envvar=True,
    is_flag=True,
    default=False,
    help="Print results as JSON for scripts.",
)
@click.version_option(__version__, prog_name="loraplane")
@click.pass_context
def cli(
    ctx: click.Context,
    *,
    registry_url: str | None,
    profile: str | None,
    token: str | None,
    data_dir: Path | None,
    timeout_s: float,
    json_mode: bool,
) -> None:
    """Manage LoRA adapters in a loraplane registry."""
    ctx.obj = CliState(
        registry=registry_url,
        token=token or None,
        data_dir=data_dir,
        timeout_s=timeout_s,
        profile=profile,
        output=Output(json_mode=json_mode),
    )
    ctx.meta[INHERITED_SETTINGS] = _agent_settings(ctx, registry_url, token)


def _agent_settings(ctx: click.Context, registry_url: str | None,
                    token: str | None) -> dict[str, str]:
    """``loraplane --registry URL --token T agent``: the group's flags count for the agent.

    The default URL does not: without a registry the agent serves --watch-dir only.
    """
    inherited = {"token": token} if token else {}
    if registry_url and ctx.get_parameter_source("registry_url") != ParameterSource.DEFAULT:
        inherited["registry"] = registry_url
    return inherited


cli.add_command(registry.registry_group)
cli.add_command(adapters.adapters_group)
cli.add_command(push.push_command)
for command in versions.COMMANDS:
    cli.add_command(command)
cli.add_command(routes.alias_group)
cli.add_command(routes.route_group)
cli.add_command(events.events_command)
cli.add_command(tokens.token_group)
cli.add_command(fleet.agents_command)
cli.add_command(fleet.rollout_command)
cli.add_command(canary.canary_group)
cli.add_command(agent_command)
cli.add_command(account.login_command)
cli.add_command(account.whoami_command)
cli.add_command(completion.completion_command)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``loraplane``)."""
    cli.main(args=argv, prog_name="loraplane", auto_envvar_prefix="LORAPLANE")


if __name__ == "__main__":
    main()
