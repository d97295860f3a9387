"""The at-head check reads and parses every migration script (about 20 ms of CPU): on a
worker thread, not the event loop's (issue 41)."""

from __future__ import annotations

import threading

import pytest

from registry_service.db import migrate
from registry_service.db.engine import Database
from tests.loop_steps import recording_thread


async def test_the_scripts_are_read_off_the_loop(db: Database,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[threading.Thread] = []
    monkeypatch.setattr(migrate, "_script_revision",
                        recording_thread(migrate._script_revision, threads))
    await migrate.ensure_at_head(db)  # the fixture's database is migrated: no error
    await migrate.upgrade(db)  # at head already: nothing to run
    assert len(threads) >= 2 and threading.current_thread() not in threads, threads
