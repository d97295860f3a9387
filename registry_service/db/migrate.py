"""Programmatic Alembic: upgrade, downgrade, the at-head check done at start-up, and
``migrate_database`` (what ``loraplane registry migrate`` runs)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import SQLAlchemyError

from registry_service.db.engine import Database
from registry_service.errors import RegistryError
from registry_service.settings import RegistrySettings

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


class DatabaseNotMigrated(RegistryError):
    status = 503
    code = "database_not_migrated"


class MigrationFailed(RegistryError):
    """A migration could not run; ``code`` says whether the database was unreachable."""

    code = "migration_failed"


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


def migrate_database(
    settings: RegistrySettings, revision: str, *, down: bool = False
) -> tuple[str | None, str | None]:
    """Move the schema up (or ``down``) to ``revision``; the revisions before and after."""
    if settings.is_sqlite:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    url = settings.effective_database_url
    try:
        return asyncio.run(_migrate(url, revision, down))
    except CommandError as exc:
        raise MigrationFailed(f"migration failed: {exc}") from exc
    except (SQLAlchemyError, OSError) as exc:
        reason = getattr(exc, "orig", None) or exc
        where = make_url(url).render_as_string(hide_password=True)
        raise MigrationFailed(
            f"cannot migrate {where}: {reason}", code="database_unavailable"
        ) from exc


async def _migrate(url: str, revision: str, down: bool) -> tuple[str | None, str | None]:
    db = Database(url)
    try:
        before = await current_revision(db)
        await (downgrade(db, revision) if down else upgrade(db, revision))
        return before, await current_revision(db)
    finally:
        await db.close()
