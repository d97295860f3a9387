"""Fixtures for the registry tests that read and write the tables directly: a migrated,
empty database of each kind (SQLite, Postgres), used by the event and desired tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from devharness.registry import reset_postgres
from devharness.services import PostgresDatabase
from registry_service.db import migrate
from registry_service.db.engine import Database


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest) -> PostgresDatabase | None:
    """The Postgres server's test database, or None for SQLite.

    A plain fixture: an async one cannot pull the async ``postgres`` fixture lazily.
    """
    if request.param == "sqlite":
        return None
    pg: PostgresDatabase = request.getfixturevalue("postgres")
    return pg


@pytest.fixture
async def database_url(server: PostgresDatabase | None, tmp_path: Path) -> str:
    """A migrated, empty database of the parametrized kind."""
    if server is None:
        url = f"sqlite+aiosqlite:///{tmp_path / 'registry.db'}"
    else:
        await reset_postgres(server)
        url = server.async_url
    db = Database(url)
    try:
        await migrate.upgrade(db)
    finally:
        await db.close()
    return url


@pytest.fixture
async def databases(database_url: str) -> AsyncIterator[Callable[[], Database]]:
    """Opens ``Database`` objects on the one test database (one per simulated replica)."""
    opened: list[Database] = []

    def open_db() -> Database:
        opened.append(Database(database_url))
        return opened[-1]

    yield open_db
    for db in opened:
        await db.close()


@pytest.fixture
async def db(databases: Callable[[], Database]) -> Database:
    return databases()
