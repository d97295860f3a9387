"""Only database errors are database errors: a file-system error inside a request gets
its own status and code, and no response carries a server path."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from sqlalchemy import text

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import adapter_parts, count_rows, staging_leftovers, upload
from registry_service.blobs import local as local_blobs
from registry_service.db.engine import Database
from registry_service.errors import Unavailable
from registry_service.versions import upload_sinks


def _no_server_path(registry: RegistryHarness, body: str) -> None:
    assert str(registry.settings.data_dir) not in body
    assert "staging" not in body


async def test_a_too_long_file_name_is_the_clients_error(
    embedded_registry: RegistryHarness, tmp_path: Path
) -> None:
    registry = embedded_registry
    await registry.create_adapter("bot")
    parts = [("files", ("a" * 300 + ".zip", b"PK\x05\x06" + b"\0" * 18))]
    response = await upload(registry, "bot", parts)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "unknown_file"
    _no_server_path(registry, response.text)
    assert staging_leftovers(registry) == []


async def test_a_full_disk_is_507_not_a_database_outage(
    embedded_registry: RegistryHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = embedded_registry
    await registry.create_adapter("bot")
    where = str(registry.settings.staging_dir / "x" / "adapter_model.safetensors")

    def full(self: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", where)

    monkeypatch.setattr(upload_sinks.FileSink, "flush", full)
    response = await upload(registry, "bot", adapter_parts(make_adapter(tmp_path / "a", seed=1)))
    assert response.status_code == 507, response.text
    error = response.json()["error"]
    assert error["code"] == "insufficient_storage", error
    assert response.headers.get("Retry-After")
    _no_server_path(registry, response.text)
    assert (await count_rows(registry))[0] == 0


async def test_a_full_blob_store_is_507_not_503(
    embedded_registry: RegistryHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full local blob store (ENOSPC) is the client's 507, as a full staging folder:
    not the 503 ``blob_store_unavailable`` of a store that cannot be reached."""
    registry = embedded_registry
    await registry.create_adapter("bot")

    def full(*_args: object, **_kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(local_blobs.LocalBlobWriter, "write", full)
    monkeypatch.setattr(local_blobs, "_copy_durably", full)
    response = await upload(registry, "bot", adapter_parts(make_adapter(tmp_path / "a", seed=1)))
    assert response.status_code == 507, response.text
    error = response.json()["error"]
    assert error["code"] == "insufficient_storage", error
    assert response.headers.get("Retry-After")
    _no_server_path(registry, response.text)
    assert (await count_rows(registry))[0] == 0


async def test_another_local_error_is_a_500_without_its_path(
    embedded_registry: RegistryHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = embedded_registry
    await registry.create_adapter("bot")
    where = str(registry.settings.staging_dir / "x")

    def broken(self: object) -> None:
        raise OSError(errno.EIO, "Input/output error", where)

    monkeypatch.setattr(upload_sinks.FileSink, "flush", broken)
    response = await upload(registry, "bot", adapter_parts(make_adapter(tmp_path / "a", seed=1)))
    assert response.status_code == 500, response.text
    assert response.json()["error"]["code"] == "local_storage_error"
    _no_server_path(registry, response.text)


async def test_the_database_unreachable_is_still_database_unavailable() -> None:
    db = Database("postgresql+asyncpg://nobody:nothing@127.0.0.1:1/none")
    try:
        with pytest.raises(Unavailable) as info:
            async with db.session() as session:
                await session.execute(text("SELECT 1"))
        assert info.value.code == "database_unavailable"
        assert "reason" not in info.value.detail or "/" not in info.value.detail["reason"]
        with pytest.raises(OSError):
            async with db.session():
                raise OSError(errno.ENAMETOOLONG, "File name too long", "/srv/staging/x")
    finally:
        await db.close()
