"""Fixtures for the outbox relay: real databases (SQLite, Postgres), real NATS."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext

from registry_service.api.metrics import RegistryMetrics
from registry_service.db import migrate
from registry_service.db.engine import Database
from registry_service.events.relay import EventRelay
from registry_service.settings import RegistrySettings
from tests.support.registry import reset_postgres
from tests.support.services import PostgresDatabase


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


RelayFactory = Callable[..., Awaitable[EventRelay]]


@pytest.fixture
async def relays(tmp_path: Path) -> AsyncIterator[RelayFactory]:
    """Starts relays wired like the app does; every one is stopped at the end."""
    async with AsyncExitStack() as stack:

        async def start(db: Database, url: str, *, metrics: RegistryMetrics | None = None,
                        **settings: Any) -> EventRelay:
            config = RegistrySettings(data_dir=tmp_path / "data", **settings)
            relay = EventRelay(db, url, settings=config, metrics=metrics or RegistryMetrics())
            # Fast retries keep outage tests short; the policy itself is unchanged.
            relay.backoff_cap_s = 0.5
            db.on_outbox_commit(relay.notify)
            await relay.start()
            stack.push_async_callback(relay.stop)
            return relay

        yield start


@pytest.fixture
async def js(nats: Any) -> AsyncIterator[JetStreamContext]:
    client = NatsClient()

    async def quiet(_exc: Exception) -> None:
        # This reader lives through the outage tests; its reconnect errors are expected.
        return None

    await client.connect(nats.url, max_reconnect_attempts=-1, reconnect_time_wait=1,
                         error_cb=quiet)
    try:
        yield JetStreamContext(client)
    finally:
        await client.close()


