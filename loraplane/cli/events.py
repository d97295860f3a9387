"""``loraplane events``: read the registry's event log, or follow it as it grows."""

from __future__ import annotations

import time
from typing import Any

import click

from loraplane.cli.client import CliError, RegistryClient, path
from loraplane.cli.context import CliState, pass_state
from loraplane.cli.output import Output, short_digest, short_time

PAGE = 1000
MAX_RETRY_DELAY_S = 30.0


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


def read_events(client: RegistryClient, after: int, limit: int) -> tuple[list[Any], int]:
    """Up to ``limit`` events after ``after``, over as many pages as it takes."""
    events: list[Any] = []
    while len(events) < limit:
        page = client.get(path("events"), {"after": after, "limit": min(PAGE, limit - len(events))})
        batch = page.get("events") or []
        events.extend(batch)
        after = max(after, int(page.get("next_after") or after))
        if not batch:
            break
    return events, after


def _poll(client: RegistryClient, out: Output, after: int, failures: int) -> tuple[int, int]:
    """One poll: print new events; the next ``after`` and the count of failed polls."""
    try:
        page = client.get(path("events"), {"after": after, "limit": PAGE})
    except CliError as exc:
        # A restarting registry is expected while following; a refusal (4xx) is not.
        if exc.status is not None and exc.status < 500:
            raise
        if failures == 0:
            out.warn(f"{exc.message}; retrying")
        time.sleep(min(MAX_RETRY_DELAY_S, 2.0**failures))
        return after, failures + 1
    if failures:
        out.info("[green]reconnected[/]")
    for event in page.get("events") or []:
        _print_event(out, event)
    return max(after, int(page.get("next_after") or after)), 0


def follow_events(client: RegistryClient, out: Output, after: int, interval_s: float) -> None:
    failures = 0
    while True:
        before = after
        after, failures = _poll(client, out, after, failures)
        if after == before and failures == 0:
            time.sleep(interval_s)


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
    events, next_after = read_events(client, after, limit)
    if out.json_mode:
        out.json({"events": events, "next_after": next_after})
        return
    if not events:
        out.info(f"no events after {after}")
    for event in events:
        _print_event(out, event)
