"""``loraplane agents`` and ``loraplane rollout``: what the fleet actually serves."""

from __future__ import annotations

import click
from rich.markup import escape

from loraplane.api import RolloutEntry, RolloutOut
from loraplane.events import ServedVersion
from loraplane_cli.context import CliState, pass_state
from loraplane_cli.output import Output

stale_option = click.option(
    "--stale-after",
    "stale_after_s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds without a report before an agent counts as stale (default: the registry's).",
)


def _served(entries: list[ServedVersion]) -> str:
    parts = []
    for entry in entries:
        name = f"{entry.adapter}@{entry.version}"
        alias = f" ({entry.alias})" if entry.alias else ""
        state = "" if entry.state == "serving" else f" [{entry.state}]"
        parts.append(f"{name}{alias}{state}")
    return ", ".join(parts) or "-"


def failure_text(code: str | None, reason: str | None) -> str:
    """A failure as ``code: reason``: the code to grep for, the reason to act on."""
    return ": ".join(part for part in (code, reason) if part) or "-"


def _failures(entries: list[ServedVersion]) -> str:
    return "; ".join(f"{e.adapter}@{e.version}: {failure_text(e.code, e.reason)}"
                     for e in entries) or "-"


@click.command("agents", short_help="The fleet: agents and what they serve.")
@click.option("--base-model", default=None, help="Only agents serving this base model.")
@stale_option
@pass_state
def agents_command(state: CliState, base_model: str | None, stale_after_s: float | None) -> None:
    """The fleet: every inference agent, what it serves and what failed there."""
    result = state.client().list_agents(base_model=base_model, stale_after_s=stale_after_s)
    rows = [
        (
            agent.agent_id,
            agent.base_model,
            f"{agent.seconds_since_seen:.0f}s ago",
            "stale" if agent.stale else "fresh",
            _served(agent.status.served),
            _failures(agent.status.failures),
        )
        for agent in result.agents
    ]
    state.output.emit(
        result,
        lambda: state.output.table(
            ("agent", "base model", "last report", "state", "serving", "failures"),
            rows,
            empty="no agent has reported yet",
            whole=("last report", "state"),
            optional=("base model",),
        ),
    )


def _entries(entries: list[RolloutEntry]) -> str:
    return ", ".join(f"{e.agent_id}{' (stale)' if e.stale else ''}" for e in entries) or "-"


def render_rollout(out: Output, rollout: RolloutOut) -> None:
    deleted = " [red](deleted)[/]" if rollout.deleted else ""
    out.line(
        escape(
            f"{rollout.adapter} (tenant {rollout.tenant}, base model "
            f"{rollout.base_model}): {rollout.agents} fresh agent(s)"
        )
        + deleted
    )
    rows = [
        (
            a.alias,
            a.version if a.version is not None else "removed",
            a.revision,
            _entries(a.serving),
            "; ".join(f"{e.agent_id}: {failure_text(e.code, e.reason)}" for e in a.failed)
            or None,
            ", ".join(a.pending) or None,
            "yes" if a.converged else "no",
        )
        for a in rollout.aliases
    ]
    out.table(
        ("alias", "version", "revision", "serving", "failed", "pending", "converged"),
        rows,
        empty="no aliases",
        whole=("version", "revision", "converged"),
    )
    for alias in rollout.aliases:
        if not alias.converged and alias.reason:
            out.line(escape(f"{alias.alias}: not converged ({alias.reason})"))
    if rollout.replicas is not None:
        out.line(escape(f"placement: {rollout.replicas} replica(s), placed on "
                        f"{', '.join(rollout.placed) or '-'}; hot on "
                        f"{', '.join(rollout.hot) or '-'}"))
        over = sorted({t.agent_id for t in rollout.tiers if t.over_capacity and not t.stale})
        if over:
            out.line(escape(f"over capacity (owned, loaded on demand) on {', '.join(over)}"))
    if rollout.unaliased:
        out.table(
            ("agent", "version", "state", "reason"),
            [(e.agent_id, e.version, e.state, failure_text(e.code, e.reason))
             for e in rollout.unaliased],
            title="versions served outside an alias",
        )


@click.command("rollout", short_help="Rollout of an adapter's aliases.")
@click.argument("name")
@stale_option
@pass_state
def rollout_command(state: CliState, name: str, stale_after_s: float | None) -> None:
    """How far each alias of adapter NAME has rolled out across the fleet."""
    rollout = state.client().rollout(name, stale_after_s=stale_after_s)
    state.output.emit(rollout, lambda: render_rollout(state.output, rollout))
