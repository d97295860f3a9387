"""Alembic environment: async engines, one script set for Postgres and SQLite."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from registry_service.db.engine import create_engine
from registry_service.db.models import Base
from registry_service.settings import RegistrySettings

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("database_url") or config.get_main_option("sqlalchemy.url")
    return str(url) if url else RegistrySettings().effective_database_url


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    context.configure(
        connection=connection,
        url=url,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds tables instead.
        render_as_batch=True,
        compare_type=True,
    )


def _run_sync(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


async def _run_online() -> None:
    engine = create_engine(_url())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run_sync)
            await connection.commit()
    finally:
        await engine.dispose()


def run() -> None:
    if context.is_offline_mode():
        _configure(url=_url())
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_sync(connection)
    else:
        asyncio.run(_run_online())


run()
