"""The page's live feed: server-sent events from a short poll of the registry's state.

Each look is a few short queries in a session of its own: the token is checked again (a
revoked token ends the stream), then the caller's events mark and fleet are compared
with the last ones sent. Only changes are sent: an idle page receives nothing but pings.
Polling, not the relay's in-process hook, so a page sees the changes made through every
replica of the registry.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from registry_service.auth.service import authenticate
from registry_service.db.engine import Database
from registry_service.errors import RegistryError
from registry_service.ui.service import change_mark, fleet

# A comment line this often when nothing changed, so proxies keep the connection open.
PING_EVERY_S = 15.0


def frame(event: str, data: str) -> str:
    return f"event: {event}\ndata: {data}\n\n"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


async def _look(db: Database, token: str | None,
                stale_after_s: float) -> tuple[tuple[int, int], str]:
    async with db.session() as session:
        principal = await authenticate(session, token)
        mark = await change_mark(session, principal)
        view = await fleet(session, principal, stale_after_s=stale_after_s)
        return mark, view.model_dump_json()


async def live_updates(db: Database, token: str | None, *, interval_s: float,
                       stale_after_s: float) -> AsyncIterator[str]:
    """``changes`` (the events mark moved: read the adapters again) and ``fleet`` (the
    new fleet) events; the first look sends both. An ``error`` event ends the stream."""
    yield "retry: 2000\n\n"
    sent_mark: tuple[int, int] | None = None
    sent_fleet: str | None = None
    quiet_s = 0.0
    while True:
        try:
            mark, fleet_json = await _look(db, token, stale_after_s)
        except RegistryError as exc:
            yield frame("error", _json({"code": exc.code, "message": exc.message}))
            return
        if mark != sent_mark:
            sent_mark, quiet_s = mark, 0.0
            yield frame("changes", _json({"events": mark[0], "seq": mark[1]}))
        if fleet_json != sent_fleet:
            sent_fleet, quiet_s = fleet_json, 0.0
            yield frame("fleet", fleet_json)
        if quiet_s >= PING_EVERY_S:
            quiet_s = 0.0
            yield ": ping\n\n"
        await asyncio.sleep(interval_s)
        quiet_s += interval_s
