"""The at-head check reads and parses every migration script (about 20 ms of CPU): on a
worker thread, not the event loop's (issue 41)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from registry_service.db import migrate
from registry_service.db.engine import Database


async def test_the_scripts_are_read_off_the_loop(db: Database,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    loop_thread = threading.get_ident()
    on_loop: list[bool] = []
    read = migrate._script_revision

    def watched(path: Path) -> tuple[str, str | None]:
        on_loop.append(threading.get_ident() == loop_thread)
        return read(path)

    monkeypatch.setattr(migrate, "_script_revision", watched)
    await migrate.ensure_at_head(db)  # the fixture's database is migrated: no error
    await migrate.upgrade(db)  # at head already: nothing to run
    assert len(on_loop) >= 2 and not any(on_loop), on_loop
