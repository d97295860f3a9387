"""``loraplane agent``: run the inference agent beside one vLLM server.

Every flag can also be given as ``LORAPLANE_<FLAG>`` (``LORAPLANE_VLLM_URL``, ...), read
by the agent's settings class; flags win. Bad settings print every problem and exit 2.
The same command runs as ``python -m inference_agent``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from click.core import ParameterSource
from pydantic import ValidationError

from loraplane.cli.client import CliError
from loraplane.cli.context import CliState
from loraplane.cli.output import Output

if TYPE_CHECKING:
    from inference_agent.settings import AgentSettings

EXIT_BAD_SETTINGS = 2
_SECRET_FIELDS = frozenset({"token"})


def describe_validation(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"])
        flag = f"--{field.replace('_', '-')} (LORAPLANE_{field.upper()}): " if field else ""
        message = str(error["msg"]).removeprefix("Value error, ")
        # The input is echoed for plain values only: a token must never reach a log.
        shown = (
            ""
            if field in _SECRET_FIELDS or "input" not in error or isinstance(error["input"], dict)
            else f" (got {error['input']!r})"
        )
        lines.append(f"  {flag}{message}{shown}")
    return "invalid agent settings:\n" + "\n".join(lines)


def _fail(ctx: click.Context, exc: CliError) -> NoReturn:
    state = ctx.find_object(CliState)
    (state.output if state is not None else Output()).error(exc)
    raise click.exceptions.Exit(exc.exit_code)


def _from_group(ctx: click.Context, given: dict[str, Any]) -> None:
    """``loraplane --registry URL --token T agent``: the global flags count too."""
    parent, state = ctx.parent, ctx.find_object(CliState)
    if parent is None or state is None:
        return
    if (
        "registry" not in given
        and parent.get_parameter_source("registry_url") != ParameterSource.DEFAULT
    ):
        given["registry"] = state.registry
    if "token" not in given and state.token is not None:
        given["token"] = state.token


def load_settings(ctx: click.Context, options: dict[str, Any]) -> AgentSettings:
    from inference_agent.settings import AgentSettings  # noqa: PLC0415 - see agent_command

    given = {k: v for k, v in options.items() if v is not None and v != ()}
    for key in ("pin", "prewarm"):
        if key in given:
            given[key] = [p.strip() for item in given[key] for p in item.split(",") if p.strip()]
    _from_group(ctx, given)
    try:
        return AgentSettings(**given)
    except ValidationError as exc:
        _fail(
            ctx,
            CliError(
                describe_validation(exc), code="invalid_settings", exit_code=EXIT_BAD_SETTINGS
            ),
        )


@click.command("agent")
@click.option(
    "--registry",
    default=None,
    metavar="URL",
    help="Registry base URL. Without one, only --watch-dir is served.",
)
@click.option("--token", default=None, help="Agent token for the registry.")
@click.option(
    "--nats-url",
    default=None,
    metavar="URL",
    help="NATS JetStream URL to follow the registry's events (without one: periodic resync only).",
)
@click.option(
    "--vllm-url",
    default=None,
    metavar="URL",
    help="The vLLM server. [default: http://127.0.0.1:8000]",
)
@click.option(
    "--base-model",
    default=None,
    help="The model vLLM serves (its --served-model-name).  [required]",
)
@click.option(
    "--base-model-config",
    type=click.Path(path_type=Path),
    default=None,
    help="The base model's config.json, to check adapter shapes before loading.",
)
@click.option(
    "--cache-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Disk cache of adapter versions. [default: ~/.loraplane/agent-cache]",
)
@click.option(
    "--cache-max-bytes",
    type=click.IntRange(min=1),
    default=None,
    help="Disk cache budget in bytes. [default: 20 GiB]",
)
@click.option(
    "--max-loaded",
    type=click.IntRange(min=1),
    default=None,
    help="Versions loaded in vLLM at once (LRU beyond). [default: 8]",
)
@click.option(
    "--max-lora-rank",
    type=click.IntRange(min=1),
    default=None,
    help="vLLM's --max-lora-rank. [default: 16]",
)
@click.option(
    "--pin",
    multiple=True,
    metavar="ADAPTER[@ALIAS]",
    help="Load at start-up and never evict (repeatable, or comma-separated).",
)
@click.option(
    "--prewarm",
    multiple=True,
    metavar="ADAPTER[@ALIAS]",
    help="Load at start-up, evictable like any other (repeatable).",
)
@click.option("--host", default=None, help="Interface to serve on. [default: 127.0.0.1]")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=None, help="Port to serve on. [default: 9000]"
)
@click.option("--agent-id", default=None, help="This agent's id. [default: host name]")
@click.option(
    "--watch-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Serve every DIR/<adapter>/ folder, reloading on change.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default=None,
    help="[default: info]",
)
@click.pass_context
def agent_command(ctx: click.Context, /, **options: Any) -> None:
    """Run the inference agent: follow the registry, hot-swap adapter versions in vLLM,
    and serve the OpenAI-compatible API in front of it.

    Every option can also be set as LORAPLANE_<OPTION> (LORAPLANE_VLLM_URL, ...).
    """
    settings = load_settings(ctx, options)
    # Imported only here: the rest of the CLI must not pay for uvicorn, nats and httpx.
    from inference_agent.errors import AgentError  # noqa: PLC0415
    from inference_agent.service import Agent, AgentConfigError  # noqa: PLC0415

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        agent = Agent(settings)
    except AgentConfigError as exc:
        _fail(ctx, CliError(str(exc), code="invalid_settings", exit_code=EXIT_BAD_SETTINGS))
    try:
        asyncio.run(agent.run())
    except AgentConfigError as exc:
        _fail(ctx, CliError(str(exc), code="invalid_settings", exit_code=EXIT_BAD_SETTINGS))
    except AgentError as exc:
        # Start-up failed (vLLM never ready, the registry refused the token...).
        _fail(ctx, CliError(f"the agent stopped: {exc.message}", code=exc.code))
