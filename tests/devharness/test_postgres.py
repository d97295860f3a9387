"""The dev harness's Postgres: a fresh database per use, and a clear message without one."""

from __future__ import annotations

import asyncpg
import pytest

from devharness.services import PostgresDatabase, ServiceStartError
from loraplane.netutil import free_port


async def test_postgres_database_is_fresh_and_dropped() -> None:
    database = PostgresDatabase()
    async with database:
        assert database.async_url.startswith("postgresql+asyncpg://")
        assert database.async_url.endswith(f"/{database.name}")
        left_open = await asyncpg.connect(database.url, timeout=5)
        assert await left_open.fetchval("SELECT current_database()") == database.name
    assert left_open.is_closed() or await _is_terminated(left_open)
    server = await asyncpg.connect(database.server_url, timeout=5)
    try:
        found = await server.fetchval(
            "SELECT count(*) FROM pg_database WHERE datname = $1", database.name
        )
    finally:
        await server.close()
    assert found == 0


async def _is_terminated(connection: asyncpg.Connection) -> bool:
    try:
        await connection.fetchval("SELECT 1")
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        return True
    finally:
        connection.terminate()
    return False


async def test_unreachable_postgres_says_how_to_provide_it() -> None:
    database = PostgresDatabase(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres")
    with pytest.raises(ServiceStartError, match="LORAPLANE_TEST_DATABASE_URL"):
        await database.create()
