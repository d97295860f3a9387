"""``loraplane agents`` and ``loraplane rollout``: what the fleet actually serves."""

from __future__ import annotations

from typing import Any

import click
from rich.markup import escape

from loraplane.cli.client import path
from loraplane.cli.context import CliState, pass_state
from loraplane.cli.output import Output

stale_option = click.option(
    "--stale-after",
    "stale_after_s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds without a report before an agent counts as stale (default: the registry's).",
)


def _served(entries: list[dict[str, Any]]) -> str:
    parts = []
    for entry in entries:
        name = f"{entry.get('adapter')}@{entry.get('version')}"
        alias = f" ({entry.get('alias')})" if entry.get("alias") else ""
        state = "" if entry.get("state") == "serving" else f" [{entry.get('state')}]"
        parts.append(f"{name}{alias}{state}")
    return ", ".join(parts) or "-"


def _failures(entries: list[dict[str, Any]]) -> str:
    return (
        "; ".join(
            f"{e.get('adapter')}@{e.get('version')}: {e.get('code') or e.get('reason')}"
            for e in entries
        )
        or "-"
    )


@click.command("agents", short_help="The fleet: agents and what they serve.")
@click.option("--base-model", default=None, help="Only agents serving this base model.")
@stale_option
@pass_state
def agents_command(state: CliState, base_model: str | None, stale_after_s: float | None) -> None:
    """The fleet: every inference agent, what it serves and what failed there."""
    result = state.client().get(
        path("agents"), {"base_model": base_model, "stale_after_s": stale_after_s}
    )
    agents = result.get("agents") or []
    rows = []
    for agent in agents:
        status = agent.get("status") or {}
        seen = agent.get("seconds_since_seen")
        rows.append(
            (
                agent.get("agent_id"),
                agent.get("base_model"),
                f"{seen:.0f}s ago" if isinstance(seen, int | float) else None,
                "stale" if agent.get("stale") else "fresh",
                _served(status.get("served") or []),
                _failures(status.get("failures") or []),
            )
        )
    state.output.emit(
        result,
        lambda: state.output.table(
            ("agent", "base model", "last report", "state", "serving", "failures"),
            rows,
            empty="no agent has reported yet",
        ),
    )


def _entries(entries: list[dict[str, Any]]) -> str:
    return (
        ", ".join(f"{e.get('agent_id')}{' (stale)' if e.get('stale') else ''}" for e in entries)
        or "-"
    )


def render_rollout(out: Output, rollout: dict[str, Any]) -> None:
    deleted = " [red](deleted)[/]" if rollout.get("deleted") else ""
    out.line(
        escape(
            f"{rollout.get('adapter')} (tenant {rollout.get('tenant')}, base model "
            f"{rollout.get('base_model')}): {rollout.get('agents')} fresh agent(s)"
        )
        + deleted
    )
    rows = [
        (
            a.get("alias"),
            a.get("version") if a.get("version") is not None else "removed",
            a.get("revision"),
            _entries(a.get("serving") or []),
            "; ".join(
                f"{e.get('agent_id')}: {e.get('code') or e.get('reason')}"
                for e in a.get("failed") or []
            )
            or None,
            ", ".join(a.get("pending") or []) or None,
            "yes" if a.get("converged") else "no",
        )
        for a in rollout.get("aliases") or []
    ]
    out.table(
        ("alias", "version", "revision", "serving", "failed", "pending", "converged"),
        rows,
        empty="no aliases",
    )
    unaliased = rollout.get("unaliased") or []
    if unaliased:
        out.table(
            ("agent", "version", "state", "reason"),
            [
                (
                    e.get("agent_id"),
                    e.get("version"),
                    e.get("state"),
                    e.get("reason") or e.get("code"),
                )
                for e in unaliased
            ],
            title="versions served outside an alias",
        )


@click.command("rollout", short_help="Rollout of an adapter's aliases.")
@click.argument("name")
@stale_option
@pass_state
def rollout_command(state: CliState, name: str, stale_after_s: float | None) -> None:
    """How far each alias of adapter NAME has rolled out across the fleet."""
    rollout = state.client().get(
        path("adapters", name, "rollout"), {"stale_after_s": stale_after_s}
    )
    state.output.emit(rollout, lambda: render_rollout(state.output, rollout))
