"""A look at a large fleet is seconds of CPU (issue 41: 1,000 adapters and 100 agents
serving 500 each): the hub then waits longer than its poll interval before the next,
so open ``/ui`` pages keep it to a share of a core instead of all of one."""

from __future__ import annotations

from pathlib import Path

from registry_service.db.engine import Database
from registry_service.ui.stream import PAUSE_PER_LOOK, StreamHub


async def test_a_long_look_is_followed_by_a_longer_pause(tmp_path: Path) -> None:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    try:
        hub = StreamHub(db, interval_s=1.0, stale_after_s=90.0)
        assert hub.pause_after(0.05) == 1.0  # a short look: the poll interval
        assert hub.pause_after(2.0) == 2.0 * PAUSE_PER_LOOK > 1.0
    finally:
        await db.close()
