"""Programmatic Alembic: upgrade, downgrade, the at-head check done at start-up, and
``migrate_database`` (what ``loraplane registry migrate`` runs).

Alembic (with Mako) is about 10 MiB of a registry's memory, for good once imported, so it
is imported only when a migration has to run: the at-head check reads the revision table
and the scripts' ``revision`` lines itself.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import SQLAlchemyError

from loraplane.private_files import private_dir
from registry_service.db.engine import Database
from registry_service.errors import RegistryError
from registry_service.settings import RegistrySettings

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
# Alembic's default, which migrations/env.py keeps.
VERSION_TABLE = "alembic_version"


class DatabaseNotMigrated(RegistryError):
    status = 503
    code = "database_not_migrated"


class MigrationFailed(RegistryError):
    """A migration could not run; ``code`` says whether the database was unreachable."""

    code = "migration_failed"


def alembic_config(database_url: str) -> Config:
    from alembic.config import Config  # noqa: PLC0415 - see the module docstring

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["database_url"] = database_url
    return config


def _script_revision(path: Path) -> tuple[str, str | None]:
    """A script's ``revision`` and ``down_revision``: plain strings in every script here."""
    found: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and isinstance(node.value, ast.Constant):
            found[node.target.id] = node.value.value
    revision, down = found.get("revision"), found.get("down_revision")
    if not isinstance(revision, str) or not isinstance(down, str | None):
        raise RuntimeError(f"{path} has no plain revision/down_revision strings")
    return revision, down


def head_revision() -> str:
    """The one revision no other script revises (what Alembic calls the head)."""
    scripts = dict(_script_revision(p) for p in sorted((MIGRATIONS_DIR / "versions").glob("*.py")))
    heads = set(scripts) - set(scripts.values())
    if len(heads) != 1:
        raise RuntimeError(f"expected one head in {MIGRATIONS_DIR}, found {sorted(heads)}")
    return heads.pop()


def _current(connection: Connection) -> str | None:
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    rows = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(rows) > 1:
        raise RuntimeError(f"the database has {len(rows)} revisions: {rows}")
    return rows[0] if rows else None


async def current_revision(db: Database) -> str | None:
    async with db.engine.connect() as conn:
        return await conn.run_sync(_current)


async def script_head() -> str:
    """``head_revision`` on a worker thread: reading and parsing every script held the
    loop for about 20 ms."""
    return await asyncio.to_thread(head_revision)


async def upgrade(db: Database, revision: str = "head") -> None:
    if revision == "head" and await current_revision(db) == await script_head():
        return  # nothing to do, and Alembic stays unimported
    await _in_connection(db, "upgrade", revision)


async def downgrade(db: Database, revision: str = "base") -> None:
    await _in_connection(db, "downgrade", revision)


async def _in_connection(db: Database, action: str, revision: str) -> None:
    from alembic import command  # noqa: PLC0415 - see the module docstring

    def run(connection: Connection) -> None:
        config = alembic_config(db.url)
        config.attributes["connection"] = connection
        getattr(command, action)(config, revision)

    async with db.engine.begin() as conn:
        await conn.run_sync(run)


async def ensure_at_head(db: Database) -> None:
    current, head = await current_revision(db), await script_head()
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
        private_dir(settings.data_dir)
    from alembic.util.exc import CommandError  # noqa: PLC0415 - see the module docstring

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
