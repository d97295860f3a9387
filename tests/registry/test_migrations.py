"""Alembic migrations on real SQLite and Postgres databases, and the start-up check.

The migrations must build exactly the schema the models describe (autogenerate finds
nothing to do), tear it down completely, and build it again. A registry on a shared
database never migrates it behind the operator's back: it refuses to start until
``loraplane registry migrate`` has run. The embedded default migrates itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from click.testing import CliRunner
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from devharness.registry import RegistryHarness
from devharness.services import NatsService, PostgresDatabase, ServiceStartError
from loraplane_cli.main import cli
from registry_service.app import create_app
from registry_service.db import migrate
from registry_service.db.base import utcnow
from registry_service.db.engine import Database
from registry_service.db.migrate import DatabaseNotMigrated
from registry_service.db.models import Base
from registry_service.settings import RegistrySettings

APP_TABLES = set(Base.metadata.tables)
VERSION_TABLE = "alembic_version"


@pytest.fixture(params=["sqlite", "postgres"])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database of each kind: a SQLite file, or a fresh Postgres database."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'registry.db'}"
        return
    pg = PostgresDatabase()
    try:
        await pg.create()
    except ServiceStartError as exc:
        pytest.fail(f"a required service could not be started:\n{exc}", pytrace=False)
    try:
        yield pg.async_url
    finally:
        await pg.drop()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    try:
        yield database
    finally:
        await database.close()


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


def _schema_diff(connection: Connection) -> list[Any]:
    # The options migrations/env.py runs autogenerate with.
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    diff: list[Any] = compare_metadata(context, Base.metadata)
    return diff


async def tables(db: Database) -> set[str]:
    async with db.engine.connect() as conn:
        return await conn.run_sync(_tables)


async def schema_diff(db: Database) -> list[Any]:
    async with db.engine.connect() as conn:
        return await conn.run_sync(_schema_diff)


def _alembic_current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def assert_at_head(db: Database) -> None:
    assert await migrate.current_revision(db) == migrate.head_revision()
    # The registry reads both without Alembic; Alembic must agree.
    alembic_head = ScriptDirectory.from_config(migrate.alembic_config("sqlite://"))
    assert migrate.head_revision() == alembic_head.get_current_head()
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_alembic_current) == migrate.head_revision()
    assert await tables(db) >= APP_TABLES
    diff = await schema_diff(db)
    assert diff == [], f"the migrations and the models disagree: {diff}"
    await migrate.ensure_at_head(db)


async def test_upgrade_downgrade_upgrade(db: Database) -> None:
    assert await tables(db) == set()
    assert await migrate.current_revision(db) is None

    await migrate.upgrade(db)
    await assert_at_head(db)

    await migrate.downgrade(db, "base")
    assert await tables(db) - {VERSION_TABLE} == set(), "downgrade left application tables"
    assert await migrate.current_revision(db) is None
    with pytest.raises(DatabaseNotMigrated):
        await migrate.ensure_at_head(db)

    await migrate.upgrade(db)
    await assert_at_head(db)
    # Upgrading a database at head changes nothing.
    await migrate.upgrade(db)
    await assert_at_head(db)


async def test_schema_diff_sees_a_missing_table(db: Database) -> None:
    """The autogenerate comparison above can fail: it notices a table the models lack."""
    await migrate.upgrade(db)
    async with db.engine.begin() as conn:
        await conn.exec_driver_sql("DROP TABLE alias_moves")
    diff = await schema_diff(db)
    assert any(op[0] == "add_table" and op[1].name == "alias_moves" for op in diff), diff


def _settings(database_url: str, data_dir: Path, nats: NatsService,
              **extra: Any) -> RegistrySettings:
    return RegistrySettings(data_dir=data_dir, database_url=database_url, nats_url=nats.url,
                            **extra)


async def test_registry_refuses_an_unmigrated_database(
    database_url: str, db: Database, tmp_path: Path, nats: NatsService,
) -> None:
    settings = _settings(database_url, tmp_path / "data", nats, auto_migrate=False)
    assert not settings.should_auto_migrate
    app = create_app(settings)
    with pytest.raises(DatabaseNotMigrated) as refused:
        async with app.router.lifespan_context(app):
            raise AssertionError("the registry started on an unmigrated database")
    message = str(refused.value)
    assert "loraplane registry migrate" in message
    assert migrate.head_revision() in message
    assert refused.value.detail == {"current": None, "head": migrate.head_revision()}
    # Refusing touched nothing: no tables, no revision.
    assert await tables(db) - {VERSION_TABLE} == set()
    assert await migrate.current_revision(db) is None

    # The command the message names fixes it (CliRunner in a thread: it runs its own loop).
    result = await asyncio.to_thread(
        CliRunner().invoke, cli, ["registry", "migrate", "--database-url", database_url])
    assert result.exit_code == 0, result.output
    assert "-> " + migrate.head_revision() in result.output
    await assert_at_head(db)

    app = create_app(settings)
    async with app.router.lifespan_context(app):
        assert app.state.ctx.db.url == settings.effective_database_url


async def test_registry_refuses_a_database_behind_head(
    database_url: str, db: Database, tmp_path: Path, nats: NatsService,
) -> None:
    """A shared database (database_url set) is not migrated by default either."""
    await migrate.upgrade(db)
    await migrate.downgrade(db, "base")
    settings = _settings(database_url, tmp_path / "data", nats)
    assert settings.auto_migrate is None and not settings.should_auto_migrate
    app = create_app(settings)
    with pytest.raises(DatabaseNotMigrated, match="loraplane registry migrate"):
        async with app.router.lifespan_context(app):
            raise AssertionError("the registry started on a database behind head")
    assert await migrate.current_revision(db) is None

    # auto_migrate=True is the explicit opt-in for a shared database.
    app = create_app(_settings(database_url, tmp_path / "data", nats, auto_migrate=True))
    async with app.router.lifespan_context(app):
        pass
    await assert_at_head(db)


async def test_embedded_default_migrates_itself(embedded_registry: RegistryHarness) -> None:
    settings = embedded_registry.settings
    assert settings.database_url is None and settings.should_auto_migrate
    db_file = settings.data_dir / "registry.db"
    assert db_file.is_file()
    await assert_at_head(embedded_registry.ctx.db)
    response = await embedded_registry.client.get("/readyz")
    assert response.status_code == 200, response.text


_OLD_RULES = """
INSERT INTO tenants (id, name, created_at) VALUES (1, 'acme', :now), (2, 'globex', :now);
INSERT INTO adapters (id, name, tenant_id, base_model, description, last_version, created_at)
VALUES (1, 'a-bot', 1, 'tiny-llama', '', 0, :now), (2, 'g-bot', 2, 'tiny-llama', '', 0, :now);
INSERT INTO routing_rules (id, kind, key, adapter_id, alias, updated_at) VALUES
 (1, 'customer', 'alice', 1, 'live', :now), (2, 'default', 'zzz', 1, 'live', :now),
 (3, 'default', '!', 1, 'canary', :now), (4, 'default', 'mine', 2, 'live', :now),
 (5, 'task', 'sum', 2, 'live', :now);
"""


async def test_0003_carries_rules_over_to_their_adapters_tenant(db: Database) -> None:
    """Rules of revision 0002 (one namespace) get their adapter's tenant; a tenant keeps
    one default rule (the lowest key, which agents used), under the key ``default``."""
    await migrate.upgrade(db, "0002")
    async with db.engine.begin() as conn:
        for statement in filter(str.strip, _OLD_RULES.split(";")):
            await conn.execute(text(statement), {"now": utcnow()})
    await migrate.upgrade(db)
    await assert_at_head(db)
    async with db.engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT tenant_id, kind, key, adapter_id, alias FROM routing_rules ORDER BY id"
        ))).all()
    assert [tuple(r) for r in rows] == [
        (1, "customer", "alice", 1, "live"), (1, "default", "default", 1, "canary"),
        (2, "default", "default", 2, "live"), (2, "task", "sum", 2, "live")]
    # Two tenants may now hold the same key; back at 0002 the oldest rule of a key stays.
    await migrate.downgrade(db, "0002")
    async with db.engine.connect() as conn:
        keys = (await conn.execute(text(
            "SELECT id, kind, key FROM routing_rules ORDER BY id"))).all()
    assert [tuple(k) for k in keys] == [(1, "customer", "alice"), (3, "default", "default"),
                                        (5, "task", "sum")]


_SHARED_AGENT_IDS = """
INSERT INTO api_tokens (id, name, token_hash, prefix, role, created_at, revoked_at, agent_id)
VALUES (1, 'a', 'h1', 'lp_1', 'agent', :now, :now, 'gpu-1'),
 (2, 'b', 'h2', 'lp_2', 'agent', :now, NULL, 'gpu-1'),
 (3, 'c', 'h3', 'lp_3', 'agent', :now, NULL, 'gpu-1'),
 (4, 'd', 'h4', 'lp_4', 'agent', :now, :now, 'gpu-2'),
 (5, 'e', 'h5', 'lp_5', 'agent', :now, :now, 'gpu-2'),
 (6, 'f', 'h6', 'lp_6', 'agent', :now, NULL, 'gpu-3');
"""


async def test_0009_leaves_each_agent_id_on_one_token(db: Database) -> None:
    """Ids several tokens shared before 0009 stay with the oldest live token (else the
    newest revoked one); the others lose the id, and no token is revoked."""
    await migrate.upgrade(db, "0008")
    async with db.engine.begin() as conn:
        await conn.execute(text(_SHARED_AGENT_IDS), {"now": utcnow()})
    await migrate.upgrade(db)
    await assert_at_head(db)
    async with db.engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT id, agent_id, revoked_at IS NOT NULL FROM api_tokens ORDER BY id"))).all()
    assert [tuple(r) for r in rows] == [
        (1, None, True), (2, "gpu-1", False), (3, None, False), (4, None, True),
        (5, "gpu-2", True), (6, "gpu-3", False)]
    async with db.engine.connect() as conn:
        with pytest.raises(IntegrityError):
            await conn.execute(text("UPDATE api_tokens SET agent_id = 'gpu-1' WHERE id = 6"))
    await migrate.downgrade(db, "0008")
