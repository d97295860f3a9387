"""Engine and session factory for Postgres (asyncpg) and SQLite (aiosqlite)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import event, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session
from sqlalchemy.pool import ConnectionPoolEntry

from loraplane.private_files import private_sqlite
from registry_service.errors import InvalidInput, Unavailable

log = logging.getLogger(__name__)


def _sqlite_pragmas(dbapi_conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    # Let SQLAlchemy's "begin" hook issue BEGIN itself (pysqlite's own handling is off).
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _sqlite_begin_immediate(conn: Any) -> None:
    # SQLite upgrades a read lock to a write lock lazily and fails with "database is
    # locked" when two writers race; taking the write lock at BEGIN serialises them.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


class JsonText(str):
    """A JSON column's value already written as JSON (``model_dump_json``): stored as it
    is. An agent's report is a model; dumping it to Python objects only for them to be
    written again cost the registry twice pydantic-core's own writer."""


def json_dumps(value: Any) -> str:
    """JSON columns' serializer: orjson, which wrote an agent's report (a few hundred
    entries) seven times faster than the standard library. Keys that are not strings
    become strings, as the standard library made them; what orjson refuses (an integer
    over 64 bits, which a request may carry) is written by the standard library. Reading
    stays with the standard library: orjson reads such an integer as a float."""
    if isinstance(value, JsonText):
        return str(value)
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value)


def create_engine(url: str, *, echo: bool = False) -> AsyncEngine:
    codec: dict[str, Any] = {"json_serializer": json_dumps}
    if url.startswith("sqlite"):
        database = make_url(url).database
        if database and database != ":memory:" and not database.startswith("file:"):
            # Token hashes and the audit log: 0600, as are SQLite's -wal and -shm.
            private_sqlite(Path(database))
        engine = create_async_engine(
            url, echo=echo, connect_args={"timeout": 30}, **codec
        )
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        event.listen(engine.sync_engine, "begin", _sqlite_begin_immediate)
        return engine
    return create_async_engine(url, echo=echo, pool_pre_ping=True, pool_size=10, **codec)


_DATABASE_MODULES = ("sqlalchemy.", "asyncpg.", "aiosqlite.", "sqlite3.")


def _raised_by_database(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside the database driver or SQLAlchemy.

    The drivers raise plain OSErrors (a refused connection, a reset socket) that
    SQLAlchemy does not wrap; an OSError of any other origin is not a database error.
    """
    tb = exc.__traceback__
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if module.startswith(_DATABASE_MODULES):
            return True
        tb = tb.tb_next
    return False


def unreachable(exc: Exception) -> Unavailable:
    # The driver's text can name hosts and files; it goes to the log, not to the client.
    log.warning("the database cannot be reached: %s", exc)
    return Unavailable("the database cannot be reached", code="database_unavailable",
                       detail={"error": type(exc).__name__})


# SQLSTATE character_not_in_repertoire: Postgres stores no NUL in text. Every text the
# registry stores or looks up came from the request, so the client is told, not a 500.
_NOT_IN_REPERTOIRE = "22021"


# Set in ``session.info`` by whoever adds an outbox row (the rows, in the order added);
# handed to the listeners after the commit.
OUTBOX_FLAG = "outbox_rows"

OutboxListener = Callable[[Sequence[Any]], None]


class Database:
    """Owns the engine; hands out one session (one transaction) per use case."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_engine(url)
        # A class of its own, so the commit hook sees only this database's sessions.
        session_class: type[Session] = type("RegistrySession", (Session,), {})
        self.sessions = async_sessionmaker(
            self.engine, expire_on_commit=False, sync_session_class=session_class
        )
        self._outbox_listeners: list[OutboxListener] = []
        event.listen(session_class, "after_commit", self._after_commit)
        event.listen(session_class, "after_soft_rollback", self._after_rollback)

    def on_outbox_commit(self, listener: OutboxListener) -> None:
        """Call ``listener`` with the outbox rows of each commit that wrote some, right
        after it (the relay publishes them at once)."""
        self._outbox_listeners.append(listener)

    def _after_commit(self, session: Session) -> None:
        rows = session.info.pop(OUTBOX_FLAG, None)
        if rows:
            for listener in self._outbox_listeners:
                listener(tuple(rows))

    def _after_rollback(self, session: Session, _previous: object) -> None:
        session.info.pop(OUTBOX_FLAG, None)

    @property
    def is_postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    @asynccontextmanager
    async def session(self, bind: AsyncConnection | None = None
                      ) -> AsyncIterator[AsyncSession]:
        """A session from the pool, or on ``bind``, a connection its caller holds."""
        try:
            async with self.sessions() if bind is None else self.sessions(bind=bind) as session:
                yield session
        except OperationalError as exc:
            raise unreachable(exc) from exc
        except OSError as exc:
            # The session spans a whole request: an OSError of the request's own work
            # (staging, the local blob store) passes through as it is.
            if not _raised_by_database(exc):
                raise
            raise unreachable(exc) from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise Unavailable("the database connection was lost",
                                  code="database_unavailable") from exc
            if getattr(exc.orig, "sqlstate", None) == _NOT_IN_REPERTOIRE:
                raise InvalidInput("a value holds a character the database cannot store (NUL)",
                                   code="invalid_character") from exc
            raise

    async def close(self) -> None:
        await self.engine.dispose()
