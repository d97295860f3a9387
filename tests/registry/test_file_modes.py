"""Issue 35, Medium 12: the registry's data folder is its user's only.

``registry.db`` holds token hashes and the audit log, ``blobs/`` every adapter. The
registry runs under umask 0 here, where a plain mkdir or open would give 0777 / 0666.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from devharness.adapters import make_adapter
from devharness.services import NatsService
from devharness.uploads import adapter_parts
from loraplane.private_files import private_sqlite
from registry_service.app import create_app
from registry_service.settings import RegistrySettings
from tests.modes_support import mode, umask_zero


@pytest.fixture(autouse=True)
def _no_umask(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in {"LORAPLANE_" + n.upper() for n in RegistrySettings.model_fields} & set(
            os.environ):
        monkeypatch.delenv(name)
    with umask_zero():
        yield


@asynccontextmanager
async def serving(settings: RegistrySettings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://registry") as client:
            yield client


async def test_the_data_folder_database_and_blobs_are_private(
    tmp_path: Path, nats: NatsService, monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("LORAPLANE_DATA_DIR", str(data))
    monkeypatch.setenv("LORAPLANE_NATS_URL", nats.url)
    async with serving(RegistrySettings()) as client:
        headers = {"Authorization": f"Bearer {(data / 'admin-token').read_text().strip()}"}
        created = await client.post("/v1/adapters", json={"name": "bot", "base_model": "tiny-llama",
                                                            "tenant": "acme"},
                                    headers=headers)
        assert created.status_code == 201, created.text
        uploaded = await client.post("/v1/adapters/bot/versions", headers=headers,
                                     files=adapter_parts(make_adapter(tmp_path / "a")))
        assert uploaded.status_code == 201, uploaded.text
        # While the registry runs: SQLite's write-ahead log and shared memory too.
        database = data / "registry.db"
        side_files = [Path(f"{database}{s}") for s in ("-wal", "-shm")]
        assert any(p.exists() for p in side_files)
        for path in [database, *side_files]:
            if path.exists():
                assert mode(path) == 0o600, path
    assert mode(data) == 0o700
    assert mode(data / "staging") == 0o700
    assert mode(data / "admin-token") == 0o600
    blobs = sorted((data / "blobs").rglob("*"))
    assert any(p.is_file() for p in blobs)
    assert mode(data / "blobs") == 0o700
    for path in blobs:
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path


def test_an_older_looser_database_is_tightened(tmp_path: Path) -> None:
    database = tmp_path / "registry.db"
    for path in (database, Path(f"{database}-wal")):
        path.write_bytes(b"")
        path.chmod(0o644)
    private_sqlite(database)
    assert mode(database) == mode(Path(f"{database}-wal")) == 0o600
    fresh = tmp_path / "fresh.db"
    private_sqlite(fresh)
    assert fresh.is_file() and mode(fresh) == 0o600
    private_sqlite(tmp_path / "missing" / "x.db")  # SQLite itself says the folder is missing
    assert not (tmp_path / "missing").exists()
