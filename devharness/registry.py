"""A running registry app for tests: real database, real blob store, real NATS."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from devharness.services import NatsService, PostgresDatabase, SeaweedS3
from registry_service.app import create_app
from registry_service.context import RegistryContext
from registry_service.db.models import Base
from registry_service.settings import RegistrySettings

ADMIN_TOKEN = "lp_test-admin-token-0123456789abcdef"
BACKENDS = ("embedded", "postgres_s3")


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclass
class RegistryHarness:
    backend: str
    client: httpx.AsyncClient
    ctx: RegistryContext
    settings: RegistrySettings
    nats: NatsService
    s3: SeaweedS3 | None
    admin_headers: dict[str, str] = field(default_factory=admin_headers)

    async def token(self, role: str, tenant: str | None = None) -> dict[str, str]:
        """A real token of ``role`` (scoped to ``tenant``), as request headers."""
        body: dict[str, Any] = {"name": f"{role}-{tenant or 'global'}", "role": role}
        if tenant is not None:
            body["tenant"] = tenant
        response = await self.client.post("/v1/tokens", json=body, headers=self.admin_headers)
        assert response.status_code == 201, response.text
        return {"Authorization": f"Bearer {response.json()['secret']}"}

    async def create_adapter(self, name: str, *, tenant: str = "acme",
                             base_model: str = "tiny-llama") -> dict[str, Any]:
        response = await self.client.post(
            "/v1/adapters", json={"name": name, "base_model": base_model, "tenant": tenant},
            headers=self.admin_headers)
        assert response.status_code == 201, response.text
        result: dict[str, Any] = response.json()
        return result


def registry_settings(backend: str, data_dir: Path, nats_url: str,
                      pg: PostgresDatabase | None, s3: SeaweedS3 | None) -> RegistrySettings:
    common: dict[str, Any] = {
        "data_dir": data_dir, "nats_url": nats_url, "admin_token": ADMIN_TOKEN,
        "relay_poll_interval_s": 0.2,
        # Tests read the fleet's gauges right after the reports that move them.
        "fleet_metrics_max_age_s": 0.0,
    }
    if backend == "embedded":
        return RegistrySettings(**common)
    assert pg is not None and s3 is not None
    return RegistrySettings(
        **common, database_url=pg.async_url, auto_migrate=True,
        s3_endpoint=s3.endpoint_url, s3_bucket=f"t-{uuid.uuid4().hex[:16]}",
        s3_access_key=s3.access_key, s3_secret_key=s3.secret_key, s3_create_bucket=True,
        s3_path_style=True,
    )


async def waiting_on_a_lock(conn: AsyncConnection, query: str = "%") -> bool:
    """Whether a session of this database waits on a lock, in a statement ``LIKE``
    ``query`` (Postgres only). ``conn`` may be inside a transaction, even the one that
    holds the lock: the statistics views' snapshot is cleared first."""
    await conn.execute(text("SELECT pg_stat_clear_snapshot()"))
    count = await conn.scalar(text(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database() AND query LIKE :query"), {"query": query})
    return bool(count)


async def blocked_on_a_lock(url: str) -> bool:
    """Whether a session of this database is waiting on a lock (Postgres only)."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return await waiting_on_a_lock(conn)
    finally:
        await engine.dispose()


async def reset_postgres(pg: PostgresDatabase) -> None:
    """Empty every table so each test starts from a clean, migrated schema."""
    engine = create_async_engine(pg.async_url)
    try:
        async with engine.begin() as conn:
            exists = await conn.scalar(text("SELECT to_regclass('public.alembic_version')"))
            if exists:
                tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
                await conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    finally:
        await engine.dispose()


@asynccontextmanager
async def running_registry(settings: RegistrySettings, backend: str, nats: NatsService,
                           s3: SeaweedS3 | None) -> AsyncIterator[RegistryHarness]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://registry") as client:
            yield RegistryHarness(backend=backend, client=client, ctx=app.state.ctx,
                                  settings=settings, nats=nats, s3=s3)
