"""``loraplane events``: read the registry's event log, or follow it as it grows."""

from __future__ import annotations

import queue
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, TypeVar

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


# Fixed widths, so lines line up in a page and in a --follow stream alike (whose
# widths are not known ahead): a 6-digit sequence, the common event types, and
# tenant/adapter of short names; a longer value only pushes its own line right.
_SEQ_WIDTH = 7
_TYPE_WIDTH = 17
_SUBJECT_WIDTH = 20


def event_line(event: dict[str, Any]) -> str:
    tenant, adapter = event.get("tenant"), event.get("adapter")
    # Tenant and fleet events (a token issued, credentials changed) name no adapter.
    subject = f"{tenant}/{adapter}" if adapter else str(tenant or "-")
    seq = f"#{event.get('seq')}"
    return (
        f"{seq:<{_SEQ_WIDTH}} {short_time(event.get('time'))}  "
        f"{event.get('type')!s:<{_TYPE_WIDTH}}  {subject:<{_SUBJECT_WIDTH}}  {describe(event)}"
    ).rstrip()


def _print_event(out: Output, event: dict[str, Any]) -> None:
    if out.json_mode:
        out.json_line(event)
    else:
        out.line(event_line(event), markup=False)


T = TypeVar("T")


def _start_deaf_to_ctrl_c(thread: threading.Thread) -> None:
    """Start ``thread`` with SIGINT blocked (a new thread inherits the mask).

    The kernel gives a process's signal to any thread not blocking it, and Python runs
    the handler in the main thread only: a Ctrl-C taken by ``thread`` would not wake the
    main thread from its wait, and the follow would go on until an event came."""
    if sys.platform == "win32":
        thread.start()
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def pulled_in_background(items: Iterator[T]) -> Iterator[T]:
    """``items``, each one produced by a daemon thread while this thread only waits.

    Ctrl-C raises KeyboardInterrupt in the main thread wherever it is. Inside httpcore it
    can land just after a connection-pool lock is acquired and before the ``with`` that
    releases it begins; the lock stays held and the pool's error path or the client's
    ``close`` then waits on it forever (a follow that hung on Ctrl-C). So the polls run
    in another thread, which a KeyboardInterrupt never reaches (Python raises it in the
    main thread only), one item at a time as asked for (as lazy as ``items`` itself),
    and the interrupt finds this thread waiting in ``get``.
    """
    asks: queue.SimpleQueue[None] = queue.SimpleQueue()
    answers: queue.SimpleQueue[tuple[T] | BaseException] = queue.SimpleQueue()

    def produce() -> None:
        while True:
            asks.get()
            try:
                answers.put((next(items),))
            except BaseException as exc:  # the end, or an error for the waiting thread
                answers.put(exc)
                return

    _start_deaf_to_ctrl_c(threading.Thread(target=produce, name="follow-events", daemon=True))
    while True:
        asks.put(None)
        answer = answers.get()
        if isinstance(answer, StopIteration):
            return
        if isinstance(answer, BaseException):
            raise answer
        yield answer[0]


def follow_events(client: RegistryClient, out: Output, after: int, interval_s: float) -> None:
    stopped = threading.Event()

    def on_retry(error: RegistryError | None, failures: int) -> None:
        # A restarting registry is expected while following; the client raises a refusal.
        # After Ctrl-C the abandoned poll fails as the client closes: nothing to say.
        if stopped.is_set():
            return
        if error is None:
            out.info("[green]reconnected[/]")
        elif failures == 1:
            out.warn(f"{error.message}; retrying")

    events = client.follow_events(after=after, interval_s=interval_s, on_retry=on_retry)
    try:
        for event in pulled_in_background(events):
            _print_event(out, event)
    finally:
        stopped.set()


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
