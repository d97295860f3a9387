"""``loraplane events``: read the registry's event log, or follow it as it grows."""

from __future__ import annotations

from typing import Any

import click

from loraplane.client import RegistryClient, RegistryError
from loraplane_cli.context import CliState, pass_state
from loraplane_cli.output import Output, short_digest, short_time


def _none(value: Any) -> str:
    return "none" if value is None else str(value)


def describe(event: dict[str, Any]) -> str:
    """What happened, in words, for each event type the registry emits."""
    kind = event.get("type")
    if kind == "adapter_updated":
        return (
            f"{event.get('alias')}: {_none(event.get('previous_version'))} -> "
            f"{'removed' if event.get('version') is None else event.get('version')} "
            f"({event.get('action')}, revision {event.get('revision')})"
        )
    if kind == "version_published":
        target = event.get("target") or {}
        return f"version {target.get('version')} ({short_digest(target.get('digest'))})"
    if kind == "adapter_deleted":
        return "adapter deleted"
    if kind == "placement_changed":
        replicas = event.get("replicas")
        return f"placement: {'none' if replicas is None else f'{replicas} replica(s)'}"
    if kind == "route_changed":
        rule = event.get("rule")
        where = f"{event.get('kind')}/{event.get('key')}"
        if not rule:
            return f"route {where} removed"
        return f"route {where} -> {rule.get('adapter')}@{rule.get('alias')}"
    return ""


def event_line(event: dict[str, Any]) -> str:
    subject = f"{event.get('tenant')}/{event.get('adapter')}"
    return (
        f"#{event.get('seq')}  {short_time(event.get('time'))}  {event.get('type')}  "
        f"{subject}  {describe(event)}"
    ).rstrip()


def _print_event(out: Output, event: dict[str, Any]) -> None:
    if out.json_mode:
        out.json_line(event)
    else:
        out.line(event_line(event), markup=False)


def follow_events(client: RegistryClient, out: Output, after: int, interval_s: float) -> None:
    def on_retry(error: RegistryError | None, failures: int) -> None:
        # A restarting registry is expected while following; the client raises a refusal.
        if error is None:
            out.info("[green]reconnected[/]")
        elif failures == 1:
            out.warn(f"{error.message}; retrying")

    for event in client.follow_events(after=after, interval_s=interval_s, on_retry=on_retry):
        _print_event(out, event)


@click.command("events", short_help="Show or follow the event log.")
@click.option(
    "--after",
    type=click.IntRange(min=0),
    default=0,
    help="Start after this event sequence number (0: from the beginning).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    help="Without --follow: show at most this many events.",
)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Keep polling and print new events as they come (Ctrl-C stops).",
)
@click.option(
    "--interval",
    "interval_s",
    type=click.FloatRange(min=0.05),
    default=1.0,
    help="Seconds between polls with --follow.",
)
@pass_state
def events_command(
    state: CliState, after: int, limit: int, follow: bool, interval_s: float
) -> None:
    """Show the event log. With --json, --follow prints one JSON object per line."""
    client, out = state.client(), state.output
    if follow:
        try:
            follow_events(client, out, after, interval_s)
        except KeyboardInterrupt:
            # Ctrl-C is how a follow ends; it is not a failure.
            return
    page = client.read_events(after=after, limit=limit)
    if out.json_mode:
        out.json(page)
        return
    if not page.events:
        out.info(f"no events after {after}")
    for event in page.events:
        _print_event(out, event)
