"""Shared fixtures: real NATS, SeaweedFS and Postgres, and a registry on each backend.

A service that cannot start fails the test with a message saying how to provide it;
nothing is skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from devharness.registry import (
    BACKENDS,
    RegistryHarness,
    registry_settings,
    reset_postgres,
    running_registry,
)
from devharness.services import (
    NatsService,
    PostgresDatabase,
    SeaweedS3,
    ServiceStartError,
)

# The shared vLLM server and the tiny model (tests/vllm_fixtures.py).
pytest_plugins = ["tests.vllm_fixtures"]


def _fail(exc: ServiceStartError) -> None:
    pytest.fail(f"a required service could not be started:\n{exc}", pytrace=False)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    s3 = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    try:
        s3.start()
    except ServiceStartError as exc:
        _fail(exc)
    try:
        yield s3
    finally:
        s3.stop()


def _in_thread(coro: Coroutine[Any, Any, None]) -> None:
    # Fixtures are resolved inside the running test loop; a database is created and
    # dropped on a loop of its own.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coro).result()


@contextmanager
def fresh_postgres() -> Iterator[PostgresDatabase]:
    """A database of its own on the test Postgres server, dropped afterwards."""
    pg = PostgresDatabase()
    try:
        _in_thread(pg.create())
    except ServiceStartError as exc:
        _fail(exc)
    try:
        yield pg
    finally:
        _in_thread(pg.drop())


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresDatabase]:
    with fresh_postgres() as pg:
        yield pg


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsService]:
    try:
        with NatsService(tmp_path) as server:
            yield server
    except ServiceStartError as exc:
        _fail(exc)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _registry(request: pytest.FixtureRequest, backend: str, tmp_path: Path,
                    nats: NatsService, **overrides: Any) -> AsyncIterator[RegistryHarness]:
    pg = s3 = None
    if backend == "postgres_s3":
        pg = request.getfixturevalue("postgres")
        s3 = request.getfixturevalue("seaweed")
        await reset_postgres(pg)
    settings = registry_settings(backend, tmp_path / "data", nats.url, pg, s3)
    if overrides:
        settings = settings.model_validate({**settings.model_dump(), **overrides})
    async with running_registry(settings, backend, nats, s3) as harness:
        yield harness


@pytest.fixture
async def registry(request: pytest.FixtureRequest, backend: str, tmp_path: Path,
                   nats: NatsService) -> AsyncIterator[RegistryHarness]:
    """A registry on each backend (embedded; Postgres + S3), with a fresh NATS."""
    async for harness in _registry(request, backend, tmp_path, nats):
        yield harness


@pytest.fixture
async def gc_registry(request: pytest.FixtureRequest, backend: str, tmp_path: Path,
                      nats: NatsService) -> AsyncIterator[RegistryHarness]:
    """A registry on each backend whose collector takes an orphan blob at once."""
    async for harness in _registry(request, backend, tmp_path, nats, blob_gc_grace_s=0.0):
        yield harness


@pytest.fixture
async def embedded_registry(request: pytest.FixtureRequest, tmp_path: Path,
                            nats: NatsService) -> AsyncIterator[RegistryHarness]:
    async for harness in _registry(request, "embedded", tmp_path, nats):
        yield harness


@pytest.fixture
async def pg_registry(request: pytest.FixtureRequest, tmp_path: Path,
                      nats: NatsService) -> AsyncIterator[RegistryHarness]:
    async for harness in _registry(request, "postgres_s3", tmp_path, nats):
        yield harness
