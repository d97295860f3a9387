"""The page's live feed: server-sent events from one shared poll of the registry's state.

One reader task per registry process looks once per tick for every open stream
(``StreamHub``), instead of one poll per stream: one query checks every stream's token
again (a revoked token ends its stream), one read of the fleet is cut into each stream's
tenant, one events mark is read per tenant with a stream open, and one read of the
running canaries (with their current step's checks so far) is cut likewise. Each stream
is sent only what changed for it: an idle page receives nothing but pings. A token may hold at
most ``ui_max_streams_per_token`` streams on one process; one more is refused with 429
``too_many_streams``. Why: docs/decisions.md#one-reader-for-every-ui-live-stream

Polling, not the relay's in-process hook, so a page sees the changes made through every
replica of the registry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from registry_service.agents.service import rollouts_by_scope
from registry_service.auth.roles import Principal, Role
from registry_service.auth.service import authenticate_many, hash_token
from registry_service.background import cancel_and_wait
from registry_service.db.engine import Database
from registry_service.errors import RegistryError, TooManyRequests
from registry_service.events.service import events_mark
from registry_service.ui.schemas import canaries_json
from registry_service.ui.service import canaries_by_scope, written_fleet

log = logging.getLogger(__name__)

# A comment line this often when nothing changed, so proxies keep the connection open.
PING_EVERY_S = 15.0
# After a look, wait at least this many times as long as it took.
PAUSE_PER_LOOK = 3.0


def frame(event: str, data: str) -> str:
    return f"event: {event}\ndata: {data}\n\n"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Look:
    """What one stream is shown after a tick: its events mark, its fleet's JSON and its
    running canaries' JSON."""
    mark: tuple[int, int]
    fleet_json: str
    canaries_json: str


@dataclass(eq=False)
class Subscriber:
    """One open stream: its token and the latest look (or error) waiting for it."""
    token: str | None
    key: str
    latest: Look | RegistryError | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def deliver(self, look: Look | RegistryError) -> None:
        self.latest = look  # only the newest matters: an older look is dropped unseen
        self.changed.set()


class StreamHub:
    """The streams of one registry process and the one task that looks for them all."""

    def __init__(self, db: Database, *, interval_s: float, stale_after_s: float) -> None:
        self._db = db
        self.interval_s = interval_s
        self.stale_after_s = stale_after_s
        self._subscribers: set[Subscriber] = set()
        self._per_token: Counter[str] = Counter()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.ticks = 0  # looks taken, for tests and the bench

    @property
    def open_streams(self) -> int:
        return len(self._subscribers)

    def subscribe(self, token: str | None, *, max_per_token: int) -> Subscriber:
        """Reserve a stream for ``token``, or refuse one past ``max_per_token``."""
        key = hash_token(token or "")
        if self._per_token[key] >= max_per_token:
            raise TooManyRequests(
                f"this token has {max_per_token} live streams open on this registry "
                "process already; close one", code="too_many_streams",
                detail={"max_streams_per_token": max_per_token})
        subscriber = Subscriber(token, key)
        self._subscribers.add(subscriber)
        self._per_token[key] += 1
        self._wake.set()  # a new stream gets its first look at once
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="ui-stream-hub")
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        if subscriber not in self._subscribers:
            return
        self._subscribers.discard(subscriber)
        self._per_token[subscriber.key] -= 1
        if self._per_token[subscriber.key] <= 0:
            del self._per_token[subscriber.key]
        if not self._subscribers and self._task is not None:
            self._task.cancel()
            self._task = None

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def pause_after(self, look_s: float) -> float:
        """The wait after a look that took ``look_s``: the poll interval, or longer after
        a long look. A look at a large fleet is seconds of CPU (on a worker thread, but a
        busy thread still slows every step of the loop): it keeps the hub to a quarter
        of a core rather than all of one."""
        return max(self.interval_s, PAUSE_PER_LOOK * look_s)

    async def _run(self) -> None:
        while self._subscribers:
            self._wake.clear()
            started = time.monotonic()
            try:
                await self.tick()
            except Exception:  # a bug: tell the streams rather than leave them hanging
                log.exception("the UI stream hub failed a look")
                self._fail_all(RegistryError("the registry failed to look for changes"))
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(),
                                       self.pause_after(time.monotonic() - started))

    def _fail_all(self, error: RegistryError) -> None:
        for subscriber in list(self._subscribers):
            subscriber.deliver(error)

    async def tick(self) -> None:
        """One look for every open stream."""
        subscribers = list(self._subscribers)
        if not subscribers:
            return
        try:
            looks = await self._look(subscribers)
        except RegistryError as exc:
            self._fail_all(exc)
            return
        finally:
            self.ticks += 1
        for subscriber, look in zip(subscribers, looks, strict=True):
            subscriber.deliver(look)

    async def _look(self, subscribers: list[Subscriber]) -> list[Look | RegistryError]:
        async with self._db.session() as session:
            found = await authenticate_many(session, (s.token for s in subscribers))
            principals: list[Principal | RegistryError] = []
            for subscriber in subscribers:
                principal = found[subscriber.token or None]
                if isinstance(principal, Principal):
                    try:
                        principal.require(Role.READER)
                    except RegistryError as exc:
                        principal = exc
                principals.append(principal)
            scopes = {p.tenant_id: p.tenant for p in principals if isinstance(p, Principal)}
            marks = {scope: await events_mark(session, tenant)
                     for scope, tenant in scopes.items()}
            # Each scope's fleet written as JSON where it is built, off the loop.
            fleet_json = await rollouts_by_scope(session, set(scopes), written_fleet,
                                                 stale_after_s=self.stale_after_s)
            canaries = await canaries_by_scope(session, set(scopes)) if scopes else {}
        running = {scope: canaries_json(found) for scope, found in canaries.items()}
        return [p if isinstance(p, RegistryError)
                else Look(marks[p.tenant_id], fleet_json[p.tenant_id], running[p.tenant_id])
                for p in principals]


async def live_updates(hub: StreamHub, subscriber: Subscriber) -> AsyncIterator[str]:
    """``changes`` (the events mark moved: read the adapters again), ``fleet`` (the new
    fleet) and ``canaries`` (the running canaries, as ``/ui/api/canaries``, whenever one
    starts, moves, ends or its step's checks change) events; the first look sends all
    three. An ``error`` event ends the stream."""
    loop = asyncio.get_running_loop()
    try:
        yield "retry: 2000\n\n"
        sent_mark: tuple[int, int] | None = None
        sent_fleet: str | None = None
        sent_canaries: str | None = None
        last_sent = loop.time()
        while True:
            quiet_left = PING_EVERY_S - (loop.time() - last_sent)
            if quiet_left <= 0:
                last_sent = loop.time()
                yield ": ping\n\n"
                continue
            try:
                await asyncio.wait_for(subscriber.changed.wait(), quiet_left)
            except TimeoutError:
                continue
            subscriber.changed.clear()
            look = subscriber.latest
            if isinstance(look, RegistryError):
                yield frame("error", _json({"code": look.code, "message": look.message}))
                return
            if look is None:
                continue
            if look.mark != sent_mark:
                sent_mark, last_sent = look.mark, loop.time()
                yield frame("changes", _json({"events": look.mark[0], "seq": look.mark[1]}))
            if look.fleet_json != sent_fleet:
                sent_fleet, last_sent = look.fleet_json, loop.time()
                yield frame("fleet", look.fleet_json)
            if look.canaries_json != sent_canaries:
                sent_canaries, last_sent = look.canaries_json, loop.time()
                yield frame("canaries", look.canaries_json)
    finally:
        hub.unsubscribe(subscriber)


def open_stream(hub: StreamHub, token: str | None, *,
                max_per_token: int) -> AsyncIterator[str]:
    """A stream's frames, its slot reserved now (429 past the cap). The slot is freed
    when the stream ends, or when a stream never started is collected."""
    subscriber = hub.subscribe(token, max_per_token=max_per_token)
    updates = live_updates(hub, subscriber)
    weakref.finalize(updates, hub.unsubscribe, subscriber)
    return updates
