"""``canary``: start a canary on an alias, watch its checks, pause, resume, promote or
abort it, and list an alias's canaries. (``rollout`` is the fleet view of a version.)"""

from __future__ import annotations

from pathlib import Path

import click
from pydantic import ValidationError

from loraplane.api.canaries import (
    Canary,
    CanaryAnalysis,
    CanaryCheck,
    CanaryList,
    CanaryVerb,
    OnFailure,
)
from loraplane_cli.context import CliState, pass_state
from loraplane_cli.output import Output, short_time
from loraplane_cli.versions import alias_option


def parse_steps(text: str) -> list[int]:
    """``"10,50"`` as ``[10, 50]``; the registry checks the range and the order."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: weights in percent, comma-separated, "
                                 "e.g. 10,50") from None


def _steps(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[int] | None:
    return None if value is None else parse_steps(value)


def read_analysis(path: Path) -> CanaryAnalysis:
    """``--analysis FILE``, checked here: a usage error (exit 2) names what is wrong."""
    try:
        return CanaryAnalysis.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror}",
                                 param_hint="'--analysis'") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'the file'}: "
                             f"{e['msg']}" for e in exc.errors()[:5])
        raise click.BadParameter(f"{path}: {problems}", param_hint="'--analysis'") from None


def render_canary(out: Output, canary: Canary) -> None:
    """The canary in words, then its checks as a table."""
    out.fields([
        ("canary", f"{canary.id} on {canary.adapter}@{canary.alias}"),
        ("state", canary.state),
        ("versions", f"stable {canary.stable_version}, canary {canary.canary_version}"),
        ("weight", f"{canary.weight}% (step {canary.step} of {canary.steps})"),
        ("step", f"{canary.step_seconds} s, on failure: {canary.on_failure}"),
        ("reason", canary.reason),
        ("by", canary.actor),
        ("started", short_time(canary.started_at)),
        ("updated", short_time(canary.updated_at)),
    ])
    _checks(out, canary.checks, "checks, latest step judged", "no step judged yet")
    if canary.live_checks is not None:
        _checks(out, canary.live_checks, "checks, this step so far", "no check")


def _checks(out: Output, checks: list[CanaryCheck], title: str, empty: str) -> None:
    rows = [(c.metric, c.stable, c.canary, c.threshold, c.stable_requests, c.canary_requests,
             c.verdict) for c in checks]
    out.table(("check", "stable", "canary", "threshold", "stable n", "canary n", "verdict"),
              rows, title=title, empty=empty, whole=("stable n", "canary n", "verdict"))


@click.group("canary", short_help="Roll a new version out on a share of an alias's traffic.")
def canary_group() -> None:
    """A canary puts a new version on a share of an alias's traffic, step by step; the
    registry compares it with the stable version at each step and promotes it, or aborts
    it with the failing check as its reason."""


@canary_group.command("start", short_help="Start a canary.")
@click.argument("name")
@click.argument("version", type=click.IntRange(min=1))
@alias_option("The alias the canary runs on.")
@click.option("--steps", callback=_steps, default=None,
              help="Weights in percent, increasing, e.g. 10,50. [default: 10,50]")
@click.option("--step-seconds", type=click.IntRange(min=1), default=None,
              help="How long each step is watched. [default: 60]")
@click.option("--on-failure", type=click.Choice(["rollback", "pause"]), default=None,
              help="Abort (weight 0) or hold when a check fails. [default: rollback]")
@click.option("--analysis", "analysis_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="FILE",
              help="The analysis as JSON: thresholds, webhooks, source, queries. "
              "[default: the registry's]")
@pass_state
def start_command(state: CliState, name: str, version: int, alias: str,
                  steps: list[int] | None, step_seconds: int | None,
                  on_failure: OnFailure | None, analysis_file: Path | None) -> None:
    """Put VERSION of adapter NAME on the first step's share of the alias's traffic."""
    analysis = read_analysis(analysis_file) if analysis_file is not None else None
    canary = state.client().start_canary(name, version, alias=alias, steps=steps,
                                         step_seconds=step_seconds, analysis=analysis,
                                         on_failure=on_failure)
    state.output.emit(canary, lambda: render_canary(state.output, canary))


@canary_group.command("status", short_help="The running canary and its checks.")
@click.argument("name")
@alias_option("The alias the canary runs on.")
@pass_state
def status_command(state: CliState, name: str, alias: str) -> None:
    """The canary running on an alias of adapter NAME, with its live checks."""
    canary = state.client().get_canary(name, alias)
    state.output.emit(canary, lambda: render_canary(state.output, canary))


def _action(verb: CanaryVerb, summary: str) -> None:
    @canary_group.command(verb, short_help=summary, help=f"{summary} (adapter NAME).")
    @click.argument("name")
    @alias_option("The alias the canary runs on.")
    @click.option("--reason", default=None, help="Why, for the alias's history.")
    @pass_state
    def command(state: CliState, name: str, alias: str, reason: str | None) -> None:
        client = state.client()
        act = {"pause": client.pause_canary, "resume": client.resume_canary,
               "promote": client.promote_canary, "abort": client.abort_canary}[verb]
        canary = act(name, alias, reason=reason)
        state.output.emit(canary, lambda: state.output.line(
            f"canary {canary.id} on {canary.adapter}@{canary.alias}: {canary.state}, "
            f"weight {canary.weight}%", markup=False))


_action("pause", "Hold the canary at its weight")
_action("resume", "Go on from a pause")
_action("promote", "Move the alias to the canary version now")
_action("abort", "Stop the canary: weight 0, the alias stays")


@canary_group.command("list", short_help="An alias's canaries, newest first.")
@click.argument("name")
@alias_option("The alias the canary runs on.")
@click.option("--limit", type=click.IntRange(min=1, max=1000), default=20, show_default=True,
              help="Show at most this many canaries.")
@pass_state
def list_command(state: CliState, name: str, alias: str, limit: int) -> None:
    """Every canary an alias of adapter NAME ran, newest first."""
    result: CanaryList = state.client().list_canaries(name, alias, limit=limit)
    rows = [(c.id, c.state, c.stable_version, c.canary_version, f"{c.weight}%", c.reason,
             short_time(c.started_at)) for c in result.canaries]
    state.output.emit(result, lambda: state.output.table(
        ("id", "state", "stable", "canary", "weight", "reason", "started"), rows,
        title=f"{name}@{alias}: canaries", empty=f"{name}@{alias} never ran a canary",
        whole=("id", "stable", "canary", "weight", "started"), optional=("reason",)))
