"""The registry over real HTTP on Postgres and SeaweedFS, for the browser tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devharness.http_registry import Served, serve_http
from devharness.services import NatsService, PostgresDatabase, SeaweedS3


@pytest.fixture
async def http_registry(tmp_path: Path, nats: NatsService, postgres: PostgresDatabase,
                        seaweed: SeaweedS3) -> AsyncIterator[Served]:
    async with serve_http("postgres_s3", tmp_path / "data", nats, postgres,
                          seaweed) as server:
        yield server
