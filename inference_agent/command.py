"""The agent's command: flags and ``LORAPLANE_*`` variables to settings, settings to a
running agent.

``agent_command`` is the one click command for it: ``python -m inference_agent`` runs it
alone, and the CLI adds the same command as ``loraplane agent``. Every flag can also be
given as ``LORAPLANE_<FLAG>`` (``LORAPLANE_VLLM_URL``, ...), read by the agent's settings
class; flags win. Bad settings print every problem and exit 2.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, get_args

import click
from pydantic import ValidationError

from inference_agent.settings import AgentSettings, LogLevel
from loraplane.nats_flags import nats_options
from loraplane.netutil import mask_url

EXIT_BAD_SETTINGS = 2
# Where an enclosing click group leaves settings that its own flags gave, in
# ``click.Context.meta`` (``loraplane --registry URL --token T agent``); the agent's
# own flags win over them.
INHERITED_SETTINGS = "inference_agent.inherited_settings"
_SECRET_FIELDS = frozenset({"token", "nats_password", "nats_token"})


class AgentStartError(click.ClickException):
    """Why the agent did not start: a message and a machine-readable code."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.message} [{self.code}]", file=file, err=file is None)


class BadAgentSettings(AgentStartError):
    """The settings are refused; every problem is in the message."""

    exit_code = EXIT_BAD_SETTINGS

    def __init__(self, message: str) -> None:
        super().__init__(message, code="invalid_settings")


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
            else f" (got {mask_url(repr(error['input']))})"
        )
        lines.append(f"  {flag}{message}{shown}")
    return "invalid agent settings:\n" + "\n".join(lines)


def load_settings(
    options: Mapping[str, Any], inherited: Mapping[str, Any] | None = None
) -> AgentSettings:
    """Flags given (then ``inherited`` ones) over ``LORAPLANE_*``; every problem at once."""
    given = {k: v for k, v in options.items() if v is not None and v != ()}
    for key in ("pin", "prewarm"):
        if key in given:
            given[key] = [p.strip() for item in given[key] for p in item.split(",") if p.strip()]
    for key, value in (inherited or {}).items():
        given.setdefault(key, value)
    try:
        return AgentSettings(**given)
    except ValidationError as exc:
        raise BadAgentSettings(describe_validation(exc)) from None


def run_agent(settings: AgentSettings) -> None:
    """Run the agent until SIGTERM or SIGINT; a failed start is an ``AgentStartError``."""
    # Imported only here: the rest of the CLI must not pay for uvicorn, nats and httpx.
    import uvloop  # noqa: PLC0415

    from inference_agent.errors import AgentError  # noqa: PLC0415
    from inference_agent.service import Agent, AgentConfigError  # noqa: PLC0415

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        agent = Agent(settings)
        # uvloop: the proxy spends less of its CPU per request in the event loop itself.
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(agent.run())
    except AgentConfigError as exc:
        raise BadAgentSettings(str(exc)) from None
    except AgentError as exc:
        # Start-up failed (vLLM never ready, the registry refused the token...).
        raise AgentStartError(f"the agent stopped: {exc.message}", code=exc.code) from None


@click.command("agent")
@click.option(
    "--registry",
    default=None,
    metavar="URL",
    help="Registry base URL. Without one, only --watch-dir is served.",
)
@click.option("--token", default=None, help="Agent token for the registry.")
@click.option(
    "--token-file",
    type=click.Path(path_type=Path),
    default=None,
    help="A file holding the agent token (a container secret), instead of --token.",
)
@click.option(
    "--nats-url",
    default=None,
    metavar="URL",
    help="NATS JetStream URL to follow the registry's events (without one: periodic resync only).",
)
@nats_options
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
    "--watch-tenant",
    default=None,
    help="The tenant every --watch-dir adapter belongs to. [default: local]",
)
@click.option(
    "--keys-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Inference credentials besides the registry's, one '<tenant> <sha256 of the "
    "token>' a line; required with --watch-dir and no --registry.",
)
@click.option(
    "--credentials-refresh-s",
    type=float,
    default=None,
    help="Re-read the registry's inference credentials this often even without an "
    "event: the longest a revocation waits. [default: 5]",
)
@click.option(
    "--log-level",
    type=click.Choice(get_args(LogLevel)),
    default=None,
    help="[default: info]",
)
@click.pass_context
def agent_command(ctx: click.Context, /, **options: Any) -> None:
    """Run the inference agent: follow the registry, hot-swap adapter versions in vLLM,
    and serve the OpenAI-compatible API in front of it.

    Every option can also be set as LORAPLANE_<OPTION> (LORAPLANE_VLLM_URL, ...).
    """
    run_agent(load_settings(options, ctx.meta.get(INHERITED_SETTINGS)))
