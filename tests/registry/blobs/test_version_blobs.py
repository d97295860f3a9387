"""``version_blobs``: an upload names its blobs in the commit of its version, and
migration 0010 names those of the versions before it, on both databases."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, text

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import adapter_parts
from registry_service.blobs.models import VersionBlob
from registry_service.db import migrate
from registry_service.db.base import utcnow
from registry_service.db.engine import Database
from registry_service.versions.models import Version
from tests.registry.test_migrations import assert_at_head, tables


async def rows(db: Database) -> set[tuple[int, str]]:
    async with db.session() as session:
        found = await session.execute(select(VersionBlob.version_id, VersionBlob.sha256))
        return {(version_id, sha) for version_id, sha in found}


async def named_by_files(db: Database) -> set[tuple[int, str]]:
    async with db.session() as session:
        versions = await session.execute(select(Version.id, Version.files))
        return {(version_id, str(f["sha256"])) for version_id, files in versions
                for f in files}


async def test_an_upload_names_its_blobs_once(
    registry: RegistryHarness, tmp_path: Path,
) -> None:
    db = registry.ctx.db
    for name in ("bot", "twin"):
        await registry.create_adapter(name)

    async def push(name: str, seed: int) -> dict[str, Any]:
        response = await registry.client.post(
            f"/v1/adapters/{name}/versions",
            files=adapter_parts(make_adapter(tmp_path / f"{name}-{seed}", seed=seed)),
            headers=registry.admin_headers)
        assert response.status_code in (200, 201), response.text
        body: dict[str, Any] = response.json()
        return body

    first, second = await push("bot", 1), await push("bot", 2)
    assert first["created"] and second["created"]
    # The two versions share their config: each names it.
    assert {f["sha256"] for f in first["files"]} & {f["sha256"] for f in second["files"]}
    named = await rows(db)
    assert named == await named_by_files(db)
    assert len(named) == len(first["files"]) + len(second["files"])

    again = await push("bot", 1)  # the same content: the same version, no new rows
    assert not again["created"] and again["version"] == 1
    assert await rows(db) == named
    twin = await push("twin", 1)  # the same content in another adapter: a version of its own
    assert twin["created"]
    assert len(await rows(db)) == len(named) + len(twin["files"])
    assert await rows(db) == await named_by_files(db)


def sha(word: str) -> str:
    return hashlib.sha256(word.encode()).hexdigest()


_ADAPTER = """
INSERT INTO tenants (id, name, created_at) VALUES (1, 'acme', :now);
INSERT INTO adapters (id, name, tenant_id, base_model, description, last_version, created_at)
VALUES (1, 'a-bot', 1, 'tiny-llama', '', 5, :now);
"""

# A repeated digest, a digest several versions share, no files, files without one.
_FILES: dict[int, list[dict[str, str | None]]] = {
    1: [{"name": "a", "sha256": sha("a")}, {"name": "b", "sha256": sha("b")},
        {"name": "copy-of-a", "sha256": sha("a")}],
    2: [{"name": "b", "sha256": sha("b")}, {"name": "c", "sha256": sha("c")}],
    3: [],
    4: [{"name": "x"}, {"name": "y", "sha256": None}],
    5: [{"name": "c", "sha256": sha("c")}],
}


async def test_0010_names_the_blobs_of_existing_versions(db: Database) -> None:
    # The database is the session's shared one: it is left at head, whatever happens.
    try:
        await migrate.downgrade(db, "0009")
        assert "version_blobs" not in await tables(db)
        async with db.engine.begin() as conn:
            for statement in filter(str.strip, _ADAPTER.split(";")):
                await conn.execute(text(statement), {"now": utcnow()})
            await conn.execute(insert(Version), [
                {"id": 10 + number, "adapter_id": 1, "number": number, "digest": f"{number:064x}",
                 "files": [{**f, "size": 1} for f in files], "total_size": len(files), "rank": 8,
                 "alpha": 16.0, "target_modules": ["q_proj"], "uploader": "tests", "notes": "",
                 "created_at": utcnow()}
                for number, files in _FILES.items()])

        await migrate.upgrade(db)

        await assert_at_head(db)
        assert await rows(db) == {(11, sha("a")), (11, sha("b")), (12, sha("b")),
                                  (12, sha("c")), (15, sha("c"))}
        await migrate.downgrade(db, "0009")
        assert "version_blobs" not in await tables(db)
    finally:
        await migrate.upgrade(db)
