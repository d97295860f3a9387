"""Programmatic Alembic: upgrade, downgrade, and the at-head check done at start-up."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from registry_service.db.engine import Database
from registry_service.errors import RegistryError

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


class DatabaseNotMigrated(RegistryError):
    status = 503
    code = "database_not_migrated"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["database_url"] = database_url
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations found in {MIGRATIONS_DIR}")
    return head


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def current_revision(db: Database) -> str | None:
    async with db.engine.connect() as conn:
        return await conn.run_sync(_current)


async def upgrade(db: Database, revision: str = "head") -> None:
    await _in_connection(db, "upgrade", revision)


async def downgrade(db: Database, revision: str = "base") -> None:
    await _in_connection(db, "downgrade", revision)


async def _in_connection(db: Database, action: str, revision: str) -> None:
    def run(connection: Connection) -> None:
        config = alembic_config(db.url)
        config.attributes["connection"] = connection
        getattr(command, action)(config, revision)

    async with db.engine.begin() as conn:
        await conn.run_sync(run)


async def ensure_at_head(db: Database) -> None:
    current, head = await current_revision(db), head_revision()
    if current != head:
        raise DatabaseNotMigrated(
            f"the database is at revision {current or 'none'}, not {head}; "
            "run `loraplane registry migrate` (with the same --database-url) first",
            detail={"current": current, "head": head},
        )
